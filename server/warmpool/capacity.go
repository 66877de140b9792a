package warmpool

// Capacity is what the pool holds ready now, for GET /v1/capacity: unlike
// Stats it reads no cgroup, so a client may poll it often.
type Capacity struct {
	// Size is the ready sandboxes each template keeps, by name.
	Size map[string]int
	// Ready counts the ready sandboxes of each template, by name (every
	// template, 0 included).
	Ready map[string]int
	// Starting counts the sandboxes being started (all templates).
	Starting int
}

// Capacity is the pool's ready and starting sandboxes.
func (p *Pool) Capacity() Capacity {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := Capacity{Size: make(map[string]int, len(p.templates)), Ready: make(map[string]int, len(p.templates)),
		Starting: int(p.stats.Starting)}
	for _, tp := range p.templates {
		c.Size[tp.t.Name] = tp.t.Size
		c.Ready[tp.t.Name] += len(tp.ready)
	}
	return c
}
