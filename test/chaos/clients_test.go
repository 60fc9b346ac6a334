package chaos

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGate(t *testing.T) {
	g := newGate()
	ctx := context.Background()
	select {
	case <-g.freezing():
		t.Fatal("a new gate is open")
	default:
	}
	g.wait(ctx) // does not block

	g.Freeze()
	select {
	case <-g.freezing():
	default:
		t.Fatal("Freeze closes the freezing channel")
	}
	thawed := make(chan struct{})
	go func() { g.wait(ctx); close(thawed) }()
	select {
	case <-thawed:
		t.Fatal("wait returned while frozen")
	case <-time.After(50 * time.Millisecond):
	}
	g.Thaw()
	select {
	case <-thawed:
	case <-time.After(time.Second):
		t.Fatal("Thaw did not release the waiter")
	}
	select {
	case <-g.freezing():
		t.Fatal("open again after Thaw")
	default:
	}
	g.Freeze() // freezes again
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	g.waitThaw(cctx) // a cancelled context ends the wait
	g.Thaw()
}

func TestScanLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "broker.log")
	require.NoError(t, os.WriteFile(path, []byte(`{"level":"warn","msg":"cannot renew"}
==================
WARNING: DATA RACE
Write at 0x00c000 by goroutine 7:
{"level":"error","msg":"panic in handler","panic":"boom"}
panic: runtime error: index out of range [recovered]
fatal error: concurrent map writes
{"level":"error","msg":"a watched key had no query; starting one","key":"k"}
{"level":"error","msg":"cannot release","key":"k"}
`), 0o644))
	got := scanLog(path)
	assert.Len(t, got, 5)
	assert.Empty(t, scanLog(filepath.Join(t.TempDir(), "none.log")), "no log, no findings")
}
