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
