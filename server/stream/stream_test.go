package stream

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// next is Next without waiting: the test knows there is something.
func next(t *testing.T, h *Hub, after uint64, maxBytes int64) Batch {
	t.Helper()
	h.mu.Lock()
	b, ok := h.batch(after, maxBytes)
	h.mu.Unlock()
	if !ok {
		t.Fatalf("nothing after %d", after)
	}
	return b
}

func texts(b Batch) []string {
	var out []string
	for _, e := range b.Events {
		switch {
		case e.Type == TypeResult:
			out = append(out, fmt.Sprintf("%d:result", e.ID))
		case e.Text != nil:
			out = append(out, fmt.Sprintf("%d:%s:%s", e.ID, e.Type, e.Text))
		default:
			out = append(out, fmt.Sprintf("%d:%s:%s", e.ID, e.Type, e.Data))
		}
	}
	return out
}

func wantTexts(t *testing.T, b Batch, want ...string) {
	t.Helper()
	if got := texts(b); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("events %q, want %q", got, want)
	}
}

// Events come out in the order they went in, with increasing ids, the
// result last; output is merged while nobody has read it, never after.
func TestHubOrderAndMerge(t *testing.T) {
	h := NewHub(Limits{})
	h.Output(TypeStdout, []byte("a"))
	h.Output(TypeStdout, []byte("b")) // merged: unread
	h.Output(TypeStderr, []byte("e"))
	if id := h.Publish("display", []byte(`{"mime":{}}`)); id != 3 {
		t.Fatalf("Publish id %d", id)
	}
	h.Output(TypeStdout, []byte("c"))
	b := next(t, h, 0, 1<<20)
	wantTexts(t, b, "1:stdout:ab", "2:stderr:e", "3:display:{\"mime\":{}}", "4:stdout:c")
	if b.Done || b.Missed != 0 {
		t.Fatalf("done %v missed %d", b.Done, b.Missed)
	}
	h.Output(TypeStdout, []byte("d")) // event 4 was read: a new event
	h.Finish()
	if h.Publish("display", nil) != 0 {
		t.Fatal("Publish after Finish took an event")
	}
	h.Output(TypeStdout, []byte("late"))
	wantTexts(t, next(t, h, 4, 1<<20), "5:stdout:d", "6:result")
	if b := next(t, h, 6, 1<<20); !b.Done || len(b.Events) != 0 {
		t.Fatalf("after the result: %+v", b)
	}
	if b := next(t, h, 5, 1<<20); !b.Done {
		t.Fatal("the batch holding the result is not Done")
	}
	// What a client was given does not change afterwards.
	if string(b.Events[3].Text) != "c" {
		t.Fatalf("a read event changed: %q", b.Events[3].Text)
	}
}

// Resuming after an id gives exactly the events after it.
func TestHubResumeAfterID(t *testing.T) {
	h := NewHub(Limits{})
	for i := range 5 {
		h.Publish("x", []byte(fmt.Sprint(i)))
	}
	wantTexts(t, next(t, h, 2, 1<<20), "3:x:2", "4:x:3", "5:x:4")
	wantTexts(t, next(t, h, 4, 1<<20), "5:x:4")
	// maxBytes bounds a batch, but one event always comes.
	wantTexts(t, next(t, h, 0, 1), "1:x:0")
}

// The ring drops the oldest events beyond its count or bytes, and a
// client behind them is told how many it missed.
func TestHubRingEviction(t *testing.T) {
	h := NewHub(Limits{MaxEvents: 3, MaxBytes: 1 << 20})
	for i := range 10 {
		h.Publish("x", []byte(fmt.Sprint(i)))
	}
	b := next(t, h, 0, 1<<20)
	wantTexts(t, b, "8:x:7", "9:x:8", "10:x:9")
	if b.Missed != 7 {
		t.Fatalf("missed %d, want 7", b.Missed)
	}
	if b := next(t, h, 8, 1<<20); b.Missed != 0 {
		t.Fatalf("a client inside the ring missed %d", b.Missed)
	}

	big := strings.Repeat("y", 1000)
	h = NewHub(Limits{MaxEvents: 100, MaxBytes: 3000, MaxChunk: 1000})
	for range 50 {
		h.Output(TypeStdout, []byte(big))
		next(t, h, 0, 1<<20) // read: no merging
	}
	h.mu.Lock()
	held, bytes := len(h.ring)-h.first, h.bytes
	ringCap := cap(h.ring)
	h.mu.Unlock()
	if held > 2 || bytes > 3000 || ringCap > 64 {
		t.Fatalf("held %d events, %d bytes, ring capacity %d", held, bytes, ringCap)
	}
	// The newest event is held whatever its size.
	h.Publish("huge", []byte(strings.Repeat("z", 10000)))
	if b := next(t, h, 50, 1<<20); len(b.Events) != 1 || b.Events[0].Type != "huge" {
		t.Fatalf("the newest event was not held: %v", texts(b))
	}
}

// A multi-byte character split between two chunks is never split between
// two events; an invalid byte is passed on; Finish flushes what is held.
func TestHubKeepsUTF8Whole(t *testing.T) {
	h := NewHub(Limits{})
	euro := []byte("€") // e2 82 ac
	h.Output(TypeStdout, append([]byte("a"), euro[:1]...))
	wantTexts(t, next(t, h, 0, 1<<20), "1:stdout:a")
	h.Output(TypeStdout, euro[1:2])
	h.Output(TypeStdout, append(euro[2:], '\xff'))
	wantTexts(t, next(t, h, 1, 1<<20), "2:stdout:€\xff")
	// Chunks longer than a character: the carry goes in front.
	h.Output(TypeStdout, append([]byte("abcd"), euro[:1]...))
	wantTexts(t, next(t, h, 2, 1<<20), "3:stdout:abcd")
	h.Output(TypeStdout, append(append([]byte{}, euro[1:]...), "efgh"...))
	wantTexts(t, next(t, h, 3, 1<<20), "4:stdout:€efgh")
	h.Output(TypeStderr, euro[:2])
	h.Finish()
	b := next(t, h, 4, 1<<20)
	wantTexts(t, b, "5:stderr:\xe2\x82", "6:result")
	if got := string(b.Events[0].JSON()); got != `{"text":"\ufffd"}` && got != `{"text":"\ufffd\ufffd"}` {
		t.Fatalf("invalid UTF-8 encoded as %s", got)
	}
}

// Next waits for the next event, and a waiting client never holds up
// the producer, however many there are and however slow they are.
func TestHubSlowSubscribersNeverBlockTheProducer(t *testing.T) {
	h := NewHub(Limits{MaxEvents: 16, MaxBytes: 1 << 20})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan Batch, 1)
	go func() {
		b, _ := h.Next(ctx, 0, 1<<20)
		got <- b
	}()
	h.Publish("first", nil)
	if b := <-got; len(b.Events) != 1 || b.Events[0].ID != 1 {
		t.Fatalf("a waiting client got %v", texts(b))
	}

	// 50 clients that each read one batch and then stop; 50 that read
	// continuously; the producer publishes 10000 events regardless.
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[int]uint64{} // events read or told missed, per reader
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var after uint64
			for {
				b, err := h.Next(ctx, after, 4<<10)
				if err != nil {
					return
				}
				mu.Lock()
				seen[i] += b.Missed + uint64(len(b.Events))
				mu.Unlock()
				if b.Done || i < 50 {
					return
				}
				after = b.Events[len(b.Events)-1].ID
			}
		}()
	}
	for i := range 10000 {
		h.Publish("x", []byte(fmt.Sprint(i)))
	}
	h.Finish()
	wg.Wait()
	for i := 50; i < 100; i++ {
		// Every event (ids 1 to 10002, the result last), read or told missed.
		if seen[i] != 10002 {
			t.Errorf("reader %d accounted for %d events, want 10002", i, seen[i])
		}
	}
	// A reader that fell behind skipped ahead and was told: nothing
	// beyond the ring was ever held for it.
	h.mu.Lock()
	held := len(h.ring) - h.first
	h.mu.Unlock()
	if held > 16 {
		t.Fatalf("the hub holds %d events", held)
	}
	// A late reader still finds the result.
	if b := next(t, h, 0, 1<<20); !b.Done || b.Missed == 0 {
		t.Fatalf("late reader: done %v missed %d", b.Done, b.Missed)
	}
}

// Next ends with its context.
func TestHubNextCancelled(t *testing.T) {
	h := NewHub(Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := h.Next(ctx, 0, 1<<20); err == nil {
		t.Fatal("Next returned without an event")
	}
}

// The registry keeps live hubs, and finished ones within their count and
// time; a reused id replaces a lingering hub.
func TestRegistry(t *testing.T) {
	now := time.Unix(1000, 0)
	r := NewRegistry(Limits{}, 2, time.Minute)
	r.now = func() time.Time { return now }
	hubs := map[string]*Hub{}
	for _, id := range []string{"a", "b", "c", "d"} {
		hubs[id] = r.NewHub()
		r.Add(id, hubs[id])
	}
	r.Remove("d", hubs["d"])
	if r.Get("d") != nil || !hubs["d"].Finished() {
		t.Fatal("a removed hub is still registered, or not finished")
	}
	for _, id := range []string{"a", "b", "c"} {
		r.Finish(id, hubs[id])
	}
	if r.Get("a") != nil || r.Get("b") != hubs["b"] || r.Get("c") != hubs["c"] {
		t.Fatal("the oldest finished hub beyond MaxFinished was kept, or a newer one dropped")
	}
	fresh := r.NewHub()
	r.Add("b", fresh)
	if r.Get("b") != fresh {
		t.Fatal("a reused id did not replace the lingering hub")
	}
	r.Finish("b", hubs["b"]) // the old hub's late Finish changes nothing
	if r.Get("b") != fresh {
		t.Fatal("the old hub's Finish removed the new one")
	}
	now = now.Add(time.Minute)
	if r.Get("c") != nil || r.Get("b") != fresh || r.Len() != 1 {
		t.Fatalf("after Linger: c %v, b live %v, len %d", r.Get("c") != nil, r.Get("b") == fresh, r.Len())
	}
}

// A refusal ends the stream in place of a result, and its hub lingers.
func TestHubRefused(t *testing.T) {
	r := NewRegistry(Limits{}, 4, time.Minute)
	h := r.NewHub()
	r.Add("x", h)
	h.Output(TypeStdout, []byte("never"))
	h.Refuse(507, []byte(`{"error":"full"}`))
	r.Remove("x", h)
	if r.Get("x") != nil {
		t.Fatal("a removed hub is kept")
	}
	r.Refuse("x", h, 400, nil) // kept again; the first refusal stands
	h.Finish()                 // changes nothing
	if r.Get("x") != h {
		t.Fatal("a refused hub was not kept")
	}
	taken := r.NewHub()
	r.Add("z", taken)
	r.Refuse("z", r.NewHub(), 409, nil)
	if r.Get("z") != taken {
		t.Fatal("a late refusal replaced the id's new hub")
	}
	b := next(t, h, 0, 1<<20)
	wantTexts(t, b, "1:stdout:never", `2:error:{"error":"full"}`)
	if !b.Done {
		t.Fatal("the refusal does not end the stream")
	}
	if st, data, ok := h.Refusal(); !ok || st != 507 || string(data) != `{"error":"full"}` {
		t.Fatalf("Refusal() = %d %s %v", st, data, ok)
	}
	other := r.NewHub()
	r.Add("y", other)
	r.Remove("y", other)
	if r.Get("y") != nil {
		t.Fatal("a hub removed without a refusal was kept")
	}
	if _, _, ok := other.Refusal(); ok {
		t.Fatal("a finished hub says it was refused")
	}
}

// SECURITY.md case 8 at the hub: 64 MB of output nobody reads costs the
// ring's buffers, not an allocation per chunk.
func TestHubFloodReusesBuffers(t *testing.T) {
	h := NewHub(Limits{})
	chunk := []byte(strings.Repeat("\xff", 64<<10-1) + "\xe2") // an incomplete character at each end
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range 1000 {
		h.Output(TypeStdout, chunk)
	}
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Fatalf("64 MB of output allocated %d MiB", grew>>20)
	}
	h.Finish()
	b := next(t, h, 0, 1<<30)
	var total int
	for _, e := range b.Events {
		total += len(e.Text)
	}
	if total > 1<<20 || b.Missed == 0 || !b.Done {
		t.Fatalf("held %d bytes, missed %d, done %v", total, b.Missed, b.Done)
	}
}
