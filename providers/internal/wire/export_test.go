package wire

import "time"

// SetClock makes t read idle times from now, so that tests move time instead of sleeping.
func SetClock(t *Transport, now func() time.Time) { t.now = now }

// Sweep closes t's connections idle for longer than IdleConnTimeout now, as its timer would.
func Sweep(t *Transport) { t.sweep() }
