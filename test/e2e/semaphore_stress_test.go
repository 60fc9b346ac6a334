package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/client"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// semLockOpts are the Go client options of the stress tests: a slot of
// limit, a short TTL and no lock-delay.
func semLockOpts(limit uint32, value string) []client.LockOption {
	return []client.LockOption{
		client.WithLimit(limit),
		client.WithTTL(10 * time.Second),
		client.WithLockDelay(0),
		client.WithValue([]byte(value)),
	}
}

// semWork stands for the work done while holding a slot (2-8 ms), so that
// holds overlap and the checker sees the limit reached.
func semWork() { time.Sleep(time.Duration(2+rand.IntN(7)) * time.Millisecond) }

// semBrokerRounds runs rounds acquire/release cycles of one Go-client
// contender, reporting each belief interval to chk. It returns the number
// of completed rounds. It runs off the test goroutine: it reports with
// t.Errorf.
func semBrokerRounds(t *testing.T, c *client.Client, prefix string, limit uint32, who string, rounds int, chk *semChecker) int {
	for round := range rounds {
		floor := chk.floor()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		l, err := c.Lock(ctx, prefix, semLockOpts(limit, who)...)
		if err != nil {
			cancel()
			t.Errorf("%s round %d: Lock: %v", who, round, err)
			return round
		}
		chk.acquired(who, floor, l.Sequencer().GetToken())
		semWork()
		if err := l.Err(); err != nil {
			t.Errorf("%s round %d: lease ended while held: %v", who, round, err)
		}
		chk.releasing(who)
		err = l.Release(ctx)
		cancel()
		if err != nil {
			t.Errorf("%s round %d: Release: %v", who, round, err)
			return round
		}
	}
	return rounds
}

// semConsulRounds is semBrokerRounds for a Consul api.Semaphore contender.
func semConsulRounds(t *testing.T, c *api.Client, prefix string, limit int, who string, rounds int, chk *semChecker) int {
	for round := range rounds {
		sem, err := c.SemaphoreOpts(&api.SemaphoreOptions{Prefix: prefix, Limit: limit, Value: []byte(who), SessionTTL: "10s"})
		if err != nil {
			t.Errorf("%s: SemaphoreOpts: %v", who, err)
			return round
		}
		held, err := sem.Acquire(nil)
		if err != nil {
			t.Errorf("%s round %d: Acquire: %v", who, round, err)
			return round
		}
		chk.acquired(who, 0, 0)
		semWork()
		select {
		case <-held:
			t.Errorf("%s round %d: api.Semaphore lost its slot while held", who, round)
		default:
		}
		chk.releasing(who)
		if err := sem.Release(); err != nil {
			t.Errorf("%s round %d: Release: %v", who, round, err)
			return round
		}
		select { // its monitor goroutine ends once the slot is gone
		case <-held:
		case <-time.After(10 * time.Second):
			t.Errorf("%s round %d: api.Semaphore's monitor did not end after Release", who, round)
		}
	}
	return rounds
}

// TestSemaphoreStressLimitAndTokens: 30 Go-client contenders over two
// replicas, limit 3, 30 rounds each: never more than 3 holders by their
// own belief intervals, tokens unique and increasing in happens-before
// order, everyone completes, nothing is left in Consul.
func TestSemaphoreStressLimitAndTokens(t *testing.T) {
	const (
		contenders = 30
		rounds     = 30
		limit      = 3
		prefix     = "stress/sem"
	)
	agent := consultest.Start(t)
	replicas := []*brokertest.Replica{brokertest.Start(t, agent), brokertest.Start(t, agent)}
	semSkipIfFreshPrefixBroken(t, replicas[0].Locks(t))
	clients := make([]*client.Client, len(replicas))
	for i, r := range replicas {
		clients[i] = client.New(r.Conn(t))
	}
	chk := newSemChecker(t, limit)

	start := time.Now()
	completed := make([]int, contenders)
	var wg sync.WaitGroup
	for i := range contenders {
		wg.Go(func() {
			who := fmt.Sprintf("broker-%02d", i)
			completed[i] = semBrokerRounds(t, clients[i%len(clients)], prefix, limit, who, rounds, chk)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	for i, n := range completed {
		assert.Equal(t, rounds, n, "contender %d completed %d of %d rounds", i, n, rounds)
	}
	grants, maxHeld := chk.stats()
	assert.Equal(t, contenders*rounds, grants)
	// How many belief intervals overlap depends on timing; two at least
	// show that the check saw holders at once.
	assert.GreaterOrEqual(t, maxHeld, 2, "no two holders at once: the check saw no contention")
	t.Logf("%d grants by %d contenders over %d replicas in %s (%.0f cycles/s), at most %d holders at once",
		grants, contenders, len(replicas), elapsed.Round(time.Millisecond), float64(grants)/elapsed.Seconds(), maxHeld)
	requireSemaphoreClean(t, agent.Client(), prefix)
}

// TestSemaphoreMixedWithConsulAPI: broker clients and Consul's own
// api.Semaphore share one prefix and never exceed the limit together.
func TestSemaphoreMixedWithConsulAPI(t *testing.T) {
	const (
		perKind = 10
		rounds  = 15
		limit   = 3
		prefix  = "stress/mixed"
	)
	agent := consultest.Start(t)
	replicas := []*brokertest.Replica{brokertest.Start(t, agent), brokertest.Start(t, agent)}
	semSkipIfFreshPrefixBroken(t, replicas[0].Locks(t))
	brokers := make([]*client.Client, len(replicas))
	for i, r := range replicas {
		brokers[i] = client.New(r.Conn(t))
	}
	consuls := make([]*api.Client, perKind)
	for i := range consuls {
		consuls[i] = agent.Client()
	}
	chk := newSemChecker(t, limit)

	start := time.Now()
	completed := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range perKind {
		wg.Go(func() {
			who := fmt.Sprintf("broker-%02d", i)
			n := semBrokerRounds(t, brokers[i%len(brokers)], prefix, limit, who, rounds, chk)
			mu.Lock()
			completed[who] = n
			mu.Unlock()
		})
		wg.Go(func() {
			who := fmt.Sprintf("consul-%02d", i)
			n := semConsulRounds(t, consuls[i], prefix, limit, who, rounds, chk)
			mu.Lock()
			completed[who] = n
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	require.Len(t, completed, 2*perKind)
	for who, n := range completed {
		assert.Equal(t, rounds, n, "%s completed %d of %d rounds", who, n, rounds)
	}
	grants, maxHeld := chk.stats()
	assert.Equal(t, 2*perKind*rounds, grants)
	t.Logf("%d grants (%d broker clients, %d api.Semaphore) in %s, at most %d holders at once",
		grants, perKind, perKind, elapsed.Round(time.Millisecond), maxHeld)
	requireSemaphoreClean(t, agent.Client(), prefix)
}
