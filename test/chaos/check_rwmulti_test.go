package chaos

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rwHold is a read-write hold of key "rw" by client c in mode, believed
// from a to b.
func rwHold(id, c int, mode string, tok uint64, a, b float64) Hold {
	h := lockHold(id, c, tok, a, b, EndReleased)
	h.Key, h.Mode, h.Kind = "rw", mode, KindReader
	if mode == ModeWrite {
		h.Kind = KindWriter
	}
	return h
}

func TestCheckRW(t *testing.T) {
	tests := []struct {
		name    string
		holds   []Hold
		freezes []Freeze
		ok      bool
	}{
		{"readers together, writers alone", []Hold{
			rwHold(1, 1, ModeRead, 10, 1, 3),
			rwHold(2, 2, ModeRead, 11, 1.5, 2.5),
			rwHold(3, 3, ModeWrite, 12, 3, 4), // touching ends do not overlap
			rwHold(4, 4, ModeWrite, 13, 4, 5),
			rwHold(5, 1, ModeRead, 14, 5, 6),
		}, nil, true},
		{"a reader beside a writer", []Hold{
			rwHold(1, 1, ModeWrite, 10, 1, 3),
			rwHold(2, 2, ModeRead, 11, 2, 4),
		}, nil, false},
		{"a writer beside readers", []Hold{
			rwHold(1, 1, ModeRead, 10, 1, 3),
			rwHold(2, 2, ModeRead, 11, 1, 3),
			rwHold(3, 3, ModeWrite, 12, 2.9, 4),
		}, nil, false},
		{"two writers", []Hold{
			rwHold(1, 1, ModeWrite, 10, 1, 3),
			rwHold(2, 2, ModeWrite, 11, 2, 4),
		}, nil, false},
		{"a frozen writer is left to fencing", []Hold{
			rwHold(1, 1, ModeWrite, 10, 1, 30),
			rwHold(2, 2, ModeRead, 11, 2, 4),
		}, []Freeze{{Client: 1, Start: s(1.5), End: s(25)}}, true},
		{"plain locks on other keys are not judged here", []Hold{
			lockHold(1, 1, 10, 1, 3, EndReleased),
			lockHold(2, 2, 11, 2, 4, EndReleased),
		}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := CheckRW(&Snapshot{Holds: tt.holds, Freezes: tt.freezes})
			assert.Equal(t, tt.ok, r.OK, "%+v", r)
			if !tt.ok {
				require.NotEmpty(t, r.Violations)
				assert.GreaterOrEqual(t, len(r.Violations[0].Excerpt), 2)
			}
		})
	}
	// Read-write holds are CheckRW's: CheckOverlap lets readers share.
	ov := CheckOverlap(&Snapshot{Holds: []Hold{rwHold(1, 1, ModeRead, 10, 1, 3), rwHold(2, 2, ModeRead, 11, 2, 4)}})
	assert.True(t, ov.OK, "%+v", ov)
}

// multiGroup is client c's multi-key grant of keys (one hold each, tokens
// from tok), believed from a to b; only the keys in got are recorded.
func multiGroup(group, c int, session string, tok uint64, a, b float64, keys, got []string) []Hold {
	var out []Hold
	for i, k := range got {
		h := lockHold(group+i, c, tok+uint64(i), a, b, EndReleased)
		h.Key, h.Kind, h.Group, h.Keys, h.Session = k, KindMulti, group, keys, session
		out = append(out, h)
	}
	return out
}

func TestCheckMulti(t *testing.T) {
	abc := []string{"m/a", "m/b", "m/c"}
	val := multiValue("client-1(multi)", abc)
	held := func(sess, value string, keys ...string) []KVHeld {
		var out []KVHeld
		for _, k := range keys {
			out = append(out, KVHeld{Key: k, Session: sess, Value: value})
		}
		return out
	}
	tests := []struct {
		name  string
		holds []Hold
		views []KVView
		ok    bool
	}{
		{"whole in belief and in Consul", multiGroup(1, 1, "s1", 10, 1, 2, abc, abc), []KVView{
			{At: s(0.5)},
			{At: s(1.5), Index: 7, Held: held("s1", val, abc...)},
			{At: s(1.6), Index: 8, Held: append(held("s1", val, abc...), held("s2", multiValue("client-2(multi)", []string{"m/d", "m/e"}), "m/d", "m/e")...)},
		}, true},
		{"Consul shows a subset (taken one by one)", multiGroup(1, 1, "s1", 10, 1, 2, abc, abc), []KVView{
			{At: s(0.9), Index: 6, Held: held("s1", val, "m/a", "m/b")},
			{At: s(1.5), Index: 7, Held: held("s1", val, abc...)},
		}, false},
		{"Consul shows a subset, value without the key list: matched by session", multiGroup(1, 1, "s1", 10, 1, 2, abc, abc), []KVView{
			{At: s(1.5), Index: 7, Held: held("s1", "opaque", "m/c")},
		}, false},
		{"a client believes a subset", multiGroup(1, 1, "s1", 10, 1, 2, abc, abc[:2]), nil, false},
		{"a client believes more than it asked for", multiGroup(1, 1, "s1", 10, 1, 2, abc[:2], abc), nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := CheckMulti(&Snapshot{Holds: tt.holds, Views: tt.views})
			assert.Equal(t, tt.ok, r.OK, "%+v", r)
			if !tt.ok {
				require.NotEmpty(t, r.Violations)
				assert.NotEmpty(t, r.Violations[0].Excerpt)
			}
		})
	}
}

func TestCheckTokenOrder(t *testing.T) {
	multi := multiGroup(10, 5, "s5", 30, 6, 7, []string{"k", "rw"}, []string{"k", "rw"})
	tests := []struct {
		name  string
		holds []Hold
		ok    bool
	}{
		{"increasing in grant order; concurrent readers in any order", append([]Hold{
			lockHold(1, 1, 10, 1, 2, EndReleased),
			lockHold(2, 2, 20, 2, 3, EndReleased),
			rwHold(3, 1, ModeRead, 12, 1, 3),
			rwHold(4, 2, ModeRead, 11, 1.005, 3), // asked before 3 was received
			rwHold(5, 3, ModeWrite, 13, 4, 5),
			rwHold(6, 4, ModeRead, 14, 5.5, 6),
		}, multi...), true},
		{"a lock's token goes back", []Hold{
			lockHold(1, 1, 20, 1, 2, EndReleased),
			lockHold(2, 2, 10, 3, 4, EndReleased),
		}, false},
		{"a writer's token is not above an earlier reader's", []Hold{
			rwHold(1, 1, ModeRead, 12, 1, 3),
			rwHold(2, 2, ModeRead, 11, 1.005, 3),
			rwHold(3, 3, ModeWrite, 12, 4, 5),
		}, false},
		{"a reader repeats the writer's token", []Hold{
			rwHold(1, 1, ModeWrite, 12, 1, 3),
			rwHold(2, 2, ModeRead, 12, 4, 5),
		}, false},
		{"one key of a multi-key grant goes back", append([]Hold{
			lockHold(1, 1, 40, 1, 2, EndReleased), // key k, token 40; the multi grant gives k token 30 later
		}, multi...), false},
		{"semaphore slots are not judged", []Hold{
			{ID: 1, Client: 1, Key: "sem", Token: 20, Call: s(0.9), Acquired: s(1), End: s(2)},
			{ID: 2, Client: 2, Key: "sem", Token: 10, Call: s(2.9), Acquired: s(3), End: s(4)},
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := CheckTokenOrder(&Snapshot{Holds: tt.holds, Limits: map[string]int{"sem": 3}})
			assert.Equal(t, tt.ok, r.OK, "%+v", r)
			if !tt.ok {
				require.NotEmpty(t, r.Violations)
				assert.Len(t, r.Violations[0].Excerpt, 2)
			}
		})
	}
}

func TestMultiKeys(t *testing.T) {
	key := func(i int) string { return fmt.Sprint(i % 3) }
	assert.Equal(t, []string{"0", "1"}, multiKeys(0, 3, key))
	assert.Equal(t, []string{"0", "2", "1"}, multiKeys(1, 3, key), "odd clients ask in falling order")
	assert.Equal(t, []string{"2", "0"}, multiKeys(2, 3, key))
	assert.Len(t, multiKeys(3, 2, key), 2, "never more keys than there are")
	v := multiValue("client-1(multi)", []string{"a/0", "a/1"})
	assert.Equal(t, []string{"a/0", "a/1"}, multiKeysOf(v))
	assert.Nil(t, multiKeysOf("client-1(lib)"))
}
