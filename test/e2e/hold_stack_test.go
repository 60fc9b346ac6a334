package e2e

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
)

// shrinkableStack is the most stack a parked goroutine of a 16 KiB stack
// may use for a GC to give half of it back: under a quarter, counting the
// runtime's guard for nosplit calls (runtime/stack.go, shrinkstack:
// used + 800 < 16 KiB / 4).
const shrinkableStack = 16<<10/4 - 800

// TestParkedHoldStack: the goroutine of a held hold, parked for the hold's
// life under gRPC's frames, the server's interceptor and handler and the
// broker's Acquire, uses less stack than shrinkableStack, so that it costs
// 8 KiB rather than 16 (80 MiB at 10,000 holds); so does a watcher's. The broker binary, run
// with GOTRACEBACK=system, dumps every goroutine with each frame's stack
// pointers on SIGQUIT. Before the server's five stream interceptors became
// one frame, a parked hold used 4,904 bytes.
func TestParkedHoldStack(t *testing.T) {
	p := brokertest.StartDev(t, brokertest.WithEnv("GOTRACEBACK=system"))
	locks := lockbrokerv1.NewLockServiceClient(lkDial(t, p.Addr))
	holds := []*lockbrokerv1.AcquireRequest{
		{Key: "stack/lock"},                                 // pooled session
		{Key: "stack/owned", Session: fast()},               // a session of its own
		{Key: "stack/sem", Limit: 3},                        // a semaphore slot
		{Key: "stack/fair", Limit: 2, Fair: true},           // a fair semaphore slot
		{Key: "stack/valued", Value: []byte("v"), Limit: 1}, // a lock with a value
	}
	for _, req := range holds {
		acquire(t, locks, req).acquired(15 * time.Second)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watches := []*lockbrokerv1.WatchRequest{{Key: "stack/lock"}, {Key: "stack", Prefix: true}}
	for _, req := range watches {
		w, err := locks.Watch(ctx, req)
		require.NoError(t, err)
		for { // the first state of a key; a prefix's whole snapshot
			resp, err := w.Recv()
			require.NoError(t, err)
			if !req.GetPrefix() || resp.GetSnapshotComplete() {
				break
			}
		}
	}
	// What a grant or a watch starts (the hold's own watch 200 ms after
	// its grant) settles; then every hold and watcher waits in a select.
	time.Sleep(500 * time.Millisecond)

	p.Signal(syscall.SIGQUIT)
	select {
	case <-p.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the broker did not exit on SIGQUIT")
	}
	dump, err := os.ReadFile(p.LogPath)
	require.NoError(t, err)

	parked := parkedStacks(string(dump), "internal/broker.(*hold).keep(")
	require.Len(t, parked, len(holds), "hold goroutines parked in keep in the dump (%s)", p.LogPath)
	for _, g := range parked {
		require.Less(t, g.used, shrinkableStack, "a parked hold's stack use: a GC would not halve its 16 KiB:\n%s", g.trace)
	}
	watchers := parkedStacks(string(dump), "internal/broker.(*Broker).Watch(")
	require.Len(t, watchers, len(watches), "Watch goroutines in the dump")
	for _, g := range watchers {
		require.Less(t, g.used, shrinkableStack, "a parked watcher's stack use: a GC would not halve its 16 KiB:\n%s", g.trace)
	}
	t.Logf("parked stack use: holds %v bytes, watchers %v bytes (limit %d)", parked, watchers, shrinkableStack)
}

var frameSP = regexp.MustCompile(`fp=0x([0-9a-f]+) sp=0x([0-9a-f]+)`)

// parkedStack is one goroutine of a dump: its trace, and how many bytes
// of stack it uses.
type parkedStack struct {
	trace string
	used  int
}

func (g parkedStack) String() string { return strconv.Itoa(g.used) }

// parkedStacks returns the goroutines of a GOTRACEBACK=system dump that
// call fn, with how many bytes of stack each uses: from its first frame's
// stack pointer to the top of its stack (the outermost frame's fp, plus
// the 32 bytes newproc leaves above it on amd64).
func parkedStacks(dump, fn string) []parkedStack {
	var gs []parkedStack
	for _, g := range strings.Split(dump, "\ngoroutine ") {
		if !strings.Contains(g, fn) {
			continue
		}
		var top, bottom uint64
		for _, m := range frameSP.FindAllStringSubmatch(g, -1) {
			fp, _ := strconv.ParseUint(m[1], 16, 64)
			sp, _ := strconv.ParseUint(m[2], 16, 64)
			top = max(top, fp)
			if bottom == 0 || sp < bottom {
				bottom = sp
			}
		}
		if bottom != 0 {
			gs = append(gs, parkedStack{trace: "goroutine " + g, used: int(top-bottom) + 32})
		}
	}
	return gs
}
