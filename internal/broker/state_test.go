package broker

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDeriveState(t *testing.T) {
	lock := func(session string) *Entry {
		return &Entry{Key: "k", Flags: LockFlagValue, Session: session, LockIndex: 3, ModifyIndex: 9}
	}
	semLock := func(body string) *Entry {
		return &Entry{Key: "k/.lock", Flags: SemaphoreFlagValue, Value: []byte(body), ModifyIndex: 12}
	}
	contender := func(sid string, held bool) *Entry {
		e := &Entry{Key: "k/" + sid, Flags: SemaphoreFlagValue, CreateIndex: 5}
		if held {
			e.Session = sid
		}
		return e
	}
	tests := []struct {
		name     string
		entries  []*Entry
		kind     Kind
		limit    uint32
		holders  []string
		conflict bool
	}{
		{name: "absent", kind: KindNone},
		{name: "sibling ignored", entries: []*Entry{{Key: "k2", Flags: LockFlagValue, Session: "s"}}, kind: KindNone},
		{name: "free lock", entries: []*Entry{lock("")}, kind: KindLock, limit: 1},
		{name: "held lock", entries: []*Entry{lock("s1")}, kind: KindLock, limit: 1, holders: []string{"s1"}},
		{name: "foreign flags", entries: []*Entry{{Key: "k", Flags: 7}}, kind: KindForeign},
		{name: "semaphore prunes dead holders", entries: []*Entry{
			semLock(`{"Limit":3,"Holders":{"a":true,"b":true,"c":true}}`), contender("a", true), contender("b", false),
		}, kind: KindSemaphore, limit: 3, holders: []string{"a"}},
		{name: "malformed body", entries: []*Entry{semLock(`{"Limit":`)}, kind: KindSemaphore, conflict: true},
		{name: "zero limit", entries: []*Entry{semLock(`{"Limit":0}`)}, kind: KindSemaphore, conflict: true},
		{name: "null holders", entries: []*Entry{semLock(`{"Limit":2,"Holders":null}`)}, kind: KindSemaphore, limit: 2},
		{name: ".lock with foreign flags is not a semaphore", entries: []*Entry{{Key: "k/.lock", Flags: 1}}, kind: KindNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := deriveState("k", tt.entries, 100)
			assert.Equal(t, tt.kind, st.Kind)
			assert.Equal(t, tt.limit, st.Limit)
			var got []string
			for _, h := range st.Holders {
				got = append(got, h.Session)
			}
			assert.Equal(t, tt.holders, got)
			assert.Equal(t, tt.conflict, semaphoreConflict(st, 3) != nil && st.semErr != nil)
			if st.sem != nil {
				assert.NotNil(t, st.sem.Holders, "api.Semaphore writes into Holders; it must never be null")
			}
		})
	}
}

func TestWaitRankOldestFirst(t *testing.T) {
	st := &State{contenders: map[string]*Entry{
		"old": {CreateIndex: 1}, "holder": {CreateIndex: 2}, "mid": {CreateIndex: 3}, "new": {CreateIndex: 4},
	}}
	holders := map[string]bool{"holder": true}
	assert.Equal(t, 0, waitRank(st, holders, "old"))
	assert.Equal(t, 1, waitRank(st, holders, "mid"))
	assert.Equal(t, 2, waitRank(st, holders, "new"))
}

// FuzzDeriveState: no input from Consul makes state derivation panic.
func FuzzDeriveState(f *testing.F) {
	f.Add("k", []byte(`{"Limit":2,"Holders":{"s":true}}`), uint64(SemaphoreFlagValue), "s")
	f.Add("k", []byte(`[]`), uint64(SemaphoreFlagValue), "")
	f.Add("k", []byte(`{"Limit":-1}`), uint64(LockFlagValue), "x")
	f.Fuzz(func(t *testing.T, key string, body []byte, flags uint64, session string) {
		entries := []*Entry{
			{Key: key + "/.lock", Flags: flags, Value: body},
			{Key: key, Flags: flags, Session: session},
			{Key: key + "/" + session, Flags: flags, Session: session},
		}
		st := deriveState(key, entries, 1)
		_ = semaphoreConflict(st, 2)
		_ = subStates(key, entries, 1)
		if st.Kind == KindSemaphore && st.semErr == nil {
			_, _, _ = semaphoreLoss(st, Sequencer{Session: session}, 2)
		}
	})
}
