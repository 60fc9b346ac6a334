// Package broker is lockbroker's domain: holds of locks and semaphore slots
// on Consul, their sessions, loss detection, and shared watches. It talks
// to Consul only through the Store interface.
package broker

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Limits and defaults of the API (documented in the proto).
const (
	DefaultTTL       = 15 * time.Second
	DefaultLockDelay = 15 * time.Second
	MinTTL           = 10 * time.Second
	MaxTTL           = 24 * time.Hour
	MaxLockDelay     = 60 * time.Second
	maxLimit         = 1024
	defaultName      = "lockbroker"
)

// Broker grants and tracks holds. It is safe for concurrent use.
type Broker struct {
	store Store
	log   *zap.Logger
	hub   *hub

	// shutdown is closed when the broker stops; holds end with
	// LostBrokerShutdown.
	shutdown     chan struct{}
	shutdownOnce sync.Once
	holds        sync.WaitGroup

	mu    sync.Mutex
	local map[string]*holdHandle // by key + "\x00" + session
}

// Option configures a Broker.
type Option func(*Broker)

// New returns a Broker on store. log must not be nil.
func New(store Store, log *zap.Logger, opts ...Option) *Broker {
	b := &Broker{
		store:    store,
		log:      log,
		hub:      newHub(store, log),
		shutdown: make(chan struct{}),
		local:    make(map[string]*holdHandle),
	}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Close ends every hold with LostBrokerShutdown (leaving broker-owned
// sessions to expire, so clients can resume them elsewhere), waits for the
// holds to finish, and stops the watches.
func (b *Broker) Close() {
	b.shutdownOnce.Do(func() {
		b.mu.Lock() // no Acquire may join b.holds once Wait starts
		close(b.shutdown)
		b.mu.Unlock()
	})
	b.holds.Wait()
	b.hub.close()
}

// holdHandle lets Release and SetValue reach a hold on this replica.
type holdHandle struct {
	mu        sync.Mutex
	seq       Sequencer
	releasing bool
	released  chan struct{}
	closeOnce sync.Once
}

// markReleased tells the hold that Release ended it.
func (h *holdHandle) markReleased() { h.closeOnce.Do(func() { close(h.released) }) }

func localKey(key, session string) string { return key + "\x00" + session }

func (b *Broker) register(key, session string) *holdHandle {
	h := &holdHandle{released: make(chan struct{})}
	b.mu.Lock()
	b.local[localKey(key, session)] = h
	b.mu.Unlock()
	return h
}

func (b *Broker) unregister(key, session string, h *holdHandle) {
	b.mu.Lock()
	if b.local[localKey(key, session)] == h {
		delete(b.local, localKey(key, session))
	}
	b.mu.Unlock()
}

func (b *Broker) lookup(key, session string) *holdHandle {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.local[localKey(key, session)]
}

// cleanupContext is for work that must finish after the caller's context
// ended (releasing a hold whose stream was cancelled).
func cleanupContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}
