package client_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"

	"github.com/lockbroker/lockbroker/client"
)

// store stands for a resource that refuses writes with a token lower than
// the highest it has seen (fencing).
type store struct{}

func (store) Write(ctx context.Context, batch string, token uint64) error { return nil }

// The README's example: hold a lock while working, stop on loss, pass the
// token to what is protected.
func ExampleClient_Lock() {
	dopts, err := client.DialOptions() // plaintext; client.WithCACert, WithClientCert, WithToken for TLS
	if err != nil {
		panic(err)
	}
	conn, err := grpc.NewClient("127.0.0.1:8700", dopts...)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ctx := context.Background()
	locks := client.New(conn) // client.WithReplicas(conn2, ...) resumes holds on another replica
	lease, err := locks.Lock(ctx, "jobs/nightly", client.WithTTL(15*time.Second), client.WithValue([]byte("host-a")))
	if err != nil {
		panic(err) // errors.Is(err, client.ErrWaitTimeout), client.ErrConflict, ...
	}
	defer lease.Release(context.WithoutCancel(ctx))
	for _, batch := range []string{"a", "b"} {
		if err := lease.Err(); err != nil { // lost: a *client.LostError, Cause says why
			panic(err)
		}
		_ = store{}.Write(ctx, batch, lease.Sequencer().GetToken())
	}
}

// A busy key names its holders.
func ExampleClient_TryLock() {
	var locks *client.Client // client.New(conn)
	_, err := locks.TryLock(context.Background(), "jobs/nightly")
	var se *client.StatusError
	if errors.Is(err, client.ErrBusy) && errors.As(err, &se) {
		for _, h := range se.Holders {
			fmt.Printf("held by %s (%s)\n", h.GetValue(), h.GetSessionId())
		}
	}
}

// Leader election: campaign, lead until the leadership is lost or the
// process resigns; observers follow the leader.
func ExampleElection() {
	var c *client.Client // client.New(conn)
	ctx := context.Background()
	e := c.Election("service/leader", client.WithTTL(10*time.Second))
	lease, err := e.Campaign(ctx, []byte("10.0.0.7:8080")) // waits until leading
	if err != nil {
		panic(err)
	}
	defer e.Resign(context.WithoutCancel(ctx))
	select {
	case <-lease.Lost(): // leadership ended: lease.Err() says why
	case <-ctx.Done():
	}

	obs, err := c.Election("service/leader").Observe(ctx)
	if err != nil {
		panic(err)
	}
	for leader := range obs.C {
		if leader == nil {
			fmt.Println("no leader")
			continue
		}
		fmt.Printf("leader is %s (token %d)\n", leader.GetValue(), leader.GetToken())
	}
}

// A read-write lock: readers share the key, a writer has it alone. Every
// grant has a fencing token; a writer's is above every token before it.
func ExampleRWMutex() {
	var c *client.Client // client.New(conn)
	ctx := context.Background()
	rw := c.RWLock("config/routes")

	r, err := rw.RLock(ctx) // waits behind a writer that arrived first
	if err != nil {
		panic(err)
	}
	fmt.Println("reading with token", r.Sequencer().GetToken(), "read:", r.Sequencer().GetRead())
	_ = r.Release(ctx)

	w, err := rw.Lock(ctx, client.WithWaitTimeout(10*time.Second))
	if err != nil {
		panic(err)
	}
	defer w.Release(context.WithoutCancel(ctx))
	_ = store{}.Write(ctx, "routes", w.Sequencer().GetToken())

	// A plain lock of a read-write key (or a read hold of a plain lock
	// key) is refused: the key is another kind.
	if _, err := c.TryLock(ctx, "config/routes"); errors.Is(err, client.ErrKindConflict) {
		var se *client.StatusError
		errors.As(err, &se)
		fmt.Println("config/routes is a", se.State.GetKind())
	}
}

// A multi-key lock: every key or none, in one Consul transaction. Each key
// has its own fencing token; losing any key ends the whole lease.
func ExampleWithKeys() {
	var c *client.Client // client.New(conn)
	ctx := context.Background()
	lease, err := c.Lock(ctx, "accounts/alice", client.WithKeys("accounts/bob"))
	if err != nil {
		panic(err)
	}
	defer lease.Release(context.WithoutCancel(ctx)) // releases both keys
	for _, seq := range lease.Sequencers() {        // in request order
		_ = store{}.Write(ctx, seq.GetKey(), seq.GetToken())
	}
	select {
	case <-lease.Lost():
		fmt.Println("lost", lease.LostKey(), "and with it the rest:", lease.Err())
	default:
	}
}
