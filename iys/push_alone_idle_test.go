package iys_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/campaignctl/campaignctl/iys"
)

// The turns' lock is held by a transaction left idle on its own connection for the whole run. A server
// (or role, or database) with idle_in_transaction_session_timeout — common on managed Postgres — ends
// that connection after the timeout, and the lock with it, silently: a push started then does not wait,
// reads the same waiting refusal and sends it again while the first push's request is on its way.
// The lock's connection now turns the timeout off for itself.
func TestAPushsTurnOutlivesAnIdleInTransactionTimeout(t *testing.T) {
	const addr = "+905324444479"
	e, pool, brand, base, plain := onayOnBothSides(t, addr)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{pool.Config().ConnConfig.Database}.Sanitize()+
		` SET idle_in_transaction_session_timeout = '400ms'`); err != nil {
		t.Fatal(err)
	}
	if rep, err := iys.RecordRefusals(ctx, pool, brand, []iys.Refusal{{Via: iys.ViaTwilioInbound, EventID: "SM79", Kind: "inbound",
		Recipient: addr, Type: "MESAJ", Evidence: "RET", At: base}}); err != nil || rep.Outboxed != 1 {
		t.Fatalf("refusal: %+v %v", rep, err)
	}
	var secondRep iys.PushReport
	b := beside(func() (err error) { secondRep, err = iys.Push(ctx, pool, plain, iys.PushOptions{}); return err })
	// The first push's request is slow (1 s: İYS under load); the second push starts then.
	hook := &hookTransport{method: http.MethodPost, pathSuffix: "/consents", before: func() { time.Sleep(time.Second); b.start() }}
	first := e.client(t, func(cfg *iys.Config) { cfg.HTTPClient = &http.Client{Transport: hook} })
	rep, err := iys.Push(ctx, pool, first, iys.PushOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.wait(t)
	if st := e.s.IYSStats(); st.AddsReceived != 1 || secondRep.Sent != 0 {
		t.Fatalf("İYS received %d adds; pushes sent %d and %d: want the refusal sent once, the second push waiting its turn",
			st.AddsReceived, rep.Sent, secondRep.Sent)
	}
}
