package worker

import (
	"os"
	"testing"
	"time"
)

// TestMain gives the package's tests a RecordWait of 5 s unless a test sets one: many make a run die by
// failing its writes to Postgres for good (faults), and such a run gives its chunk up after that wait, as
// runs did before they waited for Postgres longer. A test of the wait itself sets DefaultRecordWait.
func TestMain(m *testing.M) {
	recordWait = 5 * time.Second
	os.Exit(m.Run())
}
