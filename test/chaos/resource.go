package chaos

import "sync"

// Resource is the fenced resource the holders write to (Kleppmann's
// fencing): per key it remembers the highest token it has accepted and
// refuses a write with a lower one. It stands for the database or file
// store a real lock protects. With Fencing off (the no-fencing mutant) it
// accepts every write.
type Resource struct {
	Fencing bool

	mu   sync.Mutex
	seq  uint64
	keys map[string]*register
}

type register struct {
	maxToken uint64
	value    int64
	accepted int
	refused  int
}

// NewResource returns an empty resource that refuses stale tokens when
// fencing is true.
func NewResource(fencing bool) *Resource {
	return &Resource{Fencing: fencing, keys: map[string]*register{}}
}

// Write stores value under key if token is not lower than the highest
// token accepted for key so far. It returns whether it was accepted and
// the order in which the resource applied it.
func (r *Resource) Write(key string, token uint64, value int64) (accepted bool, seq uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	reg := r.keys[key]
	if reg == nil {
		reg = &register{}
		r.keys[key] = reg
	}
	if r.Fencing && token < reg.maxToken {
		reg.refused++
		return false, r.seq
	}
	reg.maxToken = max(reg.maxToken, token)
	reg.value = value
	reg.accepted++
	return true, r.seq
}

// Refused is the number of writes refused so far, over all keys.
func (r *Resource) Refused() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, reg := range r.keys {
		n += reg.refused
	}
	return n
}
