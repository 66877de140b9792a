package results

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// clock is a settable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func open(t *testing.T, dir string, o Options) *Store {
	t.Helper()
	o.MaxBytes = cmpOr(o.MaxBytes, 1<<20)
	o.MaxCount = cmpOr(o.MaxCount, 100)
	o.TTL = cmpOr(o.TTL, time.Hour)
	o.JanitorInterval = cmpOr(o.JanitorInterval, time.Hour) // tests call Sweep
	s, err := Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func cmpOr[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

var runN int

func run() string { runN++; return fmt.Sprintf("run-%08x", runN) }

// store writes a finished answer for id: text "{<id>:" + part + "}" with one
// part of n bytes.
func store(t *testing.T, s *Store, id string, n int) (want string) {
	t.Helper()
	if _, err := s.Create(id, run(), "h-"+id, nil); err != nil {
		t.Fatal(err)
	}
	part := bytes.Repeat([]byte{byte(len(id))}, n)
	f, err := s.CreatePart(id, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(part)
	f.Close()
	text := `{"` + id + `":"",}`
	rd, err := s.Finish(id, []byte(text), []int64{int64(len(id) + 5)})
	if err != nil {
		t.Fatal(err)
	}
	rd.Close()
	return `{"` + id + `":"` + base64.StdEncoding.EncodeToString(part) + `",}`
}

func read(t *testing.T, s *Store, id string) (string, error) {
	t.Helper()
	rd, err := s.Open(id)
	if err != nil {
		return "", err
	}
	defer rd.Close()
	var b bytes.Buffer
	n, err := rd.WriteTo(&b)
	if err != nil {
		t.Fatal(err)
	}
	if n != rd.Len() || int64(b.Len()) != n {
		t.Fatalf("WriteTo wrote %d (buffer %d), Len says %d", n, b.Len(), rd.Len())
	}
	return b.String(), nil
}

// Holes are filled with their parts' base64, across chunk boundaries, and
// parts beyond the holes are removed.
func TestRoundTrip(t *testing.T) {
	s := open(t, t.TempDir(), Options{MaxBytes: 1 << 30})
	e, err := s.Create("a", "run-0000aaaa", "hash", []byte(`{"k":1}`))
	if err != nil || e.Final() || e.Run != "run-0000aaaa" {
		t.Fatalf("Create = %+v %v", e, err)
	}
	var parts [][]byte
	for i, n := range []int{0, 1, 2, 3, chunk - 1, chunk, chunk + 1, 3*chunk + 2} {
		p := make([]byte, n)
		for j := range p {
			p[j] = byte(i*7 + j*13)
		}
		parts = append(parts, p)
		f, err := s.CreatePart("a", i)
		if err != nil {
			t.Fatal(err)
		}
		f.Write(p)
		f.Close()
	}
	stale, _ := s.CreatePart("a", len(parts)) // written, then not used
	stale.Write([]byte("stale"))
	stale.Close()
	var text strings.Builder
	var want strings.Builder
	var holes []int64
	text.WriteString(strings.Repeat("x", chunk+5)) // a text longer than a chunk
	want.WriteString(strings.Repeat("x", chunk+5))
	for i, p := range parts {
		holes = append(holes, int64(text.Len()))
		fmt.Fprintf(&text, "|%d|", i)
		want.WriteString(base64.StdEncoding.EncodeToString(p))
		fmt.Fprintf(&want, "|%d|", i)
	}
	rd, err := s.Finish("a", []byte(text.String()), holes)
	if err != nil {
		t.Fatal(err)
	}
	rd.Close()
	got, err := read(t, s, "a")
	if err != nil || got != want.String() {
		t.Fatalf("answer differs (%v): got %d bytes, want %d", err, len(got), want.Len())
	}
	if _, err := os.Stat(filepath.Join(s.dir, "run-0000aaaa", partName(len(parts)))); !os.IsNotExist(err) {
		t.Errorf("the unused part is still there: %v", err)
	}
	e, _ = s.Get("a")
	var size int64 = int64(text.Len())
	for _, p := range parts {
		size += int64(len(p))
	}
	if e.Size() != size || !e.Final() || string(e.Info) != `{"k":1}` || e.BodyHash != "hash" {
		t.Errorf("entry %+v (size %d, want %d)", e, e.Size(), size)
	}
	if _, err := s.Create("a", "run-0000bbbb", "other", nil); !errors.Is(err, ErrExists) {
		t.Errorf("second Create of a = %v", err)
	}
	if _, err := s.Open("nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open(nope) = %v", err)
	}
	if _, err := s.Create("b", "../escape", "", nil); err == nil {
		t.Error("a run name that is not ValidRun was accepted")
	}
}

func TestPendingIsNotReadable(t *testing.T) {
	s := open(t, t.TempDir(), Options{})
	s.Create("p", run(), "h", nil)
	if _, err := s.Open("p"); !errors.Is(err, ErrPending) {
		t.Fatalf("Open(pending) = %v", err)
	}
	s.Discard("p")
	if _, ok := s.Get("p"); ok {
		t.Fatal("discarded entry still there")
	}
	if _, err := s.Create("p", run(), "h2", nil); err != nil {
		t.Fatalf("id not free after Discard: %v", err)
	}
}

// The byte budget evicts the oldest finished answers first and never a
// pending one; the sizes count text and parts.
func TestEvictByBytes(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	s := open(t, dir, Options{MaxBytes: 3000, Now: clk.now})
	s.Create("live", run(), "h", nil) // pending throughout
	for i := range 3 {
		clk.add(time.Second)
		store(t, s, fmt.Sprintf("r%d", i), 900) // 900 + 10 bytes of text each
	}
	if n, b := s.Stats(); n != 3 || b != 3*910 {
		t.Fatalf("stats = %d, %d", n, b)
	}
	clk.add(time.Second)
	store(t, s, "r3", 900) // over 3000: r0 goes
	if _, err := s.Open("r0"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("oldest not evicted: %v", err)
	}
	for _, id := range []string{"r1", "r2", "r3"} {
		if _, err := read(t, s, id); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	clk.add(time.Second)
	store(t, s, "big", 2900) // alone nearly the budget: every older one goes
	for _, id := range []string{"r1", "r2", "r3"} {
		if _, ok := s.Get(id); ok {
			t.Errorf("%s survived", id)
		}
	}
	if e, ok := s.Get("live"); !ok || e.Final() {
		t.Error("the pending execution was evicted")
	}
	if _, err := read(t, s, "big"); err != nil {
		t.Fatal(err)
	}
	// Only big's directory and live's (none yet) remain.
	if runs := runDirs(t, dir); len(runs) != 1 {
		t.Errorf("run directories left: %v", runs)
	}
}

func runDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if ValidRun(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestEvictByCount(t *testing.T) {
	clk := newClock()
	s := open(t, t.TempDir(), Options{MaxCount: 2, Now: clk.now})
	for i := range 4 {
		clk.add(time.Second)
		store(t, s, fmt.Sprintf("c%d", i), 10)
	}
	if n, _ := s.Stats(); n != 2 {
		t.Fatalf("%d kept", n)
	}
	if _, ok := s.Get("c1"); ok {
		t.Fatal("c1 kept over the count")
	}
	if _, ok := s.Get("c3"); !ok {
		t.Fatal("c3 evicted")
	}
}

// Eviction follows the order the answers finished in: not the order they
// were created in, nor their ids' order (the database's), and that order
// survives a restart.
func TestEvictionOrderIsFinishOrder(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	s := open(t, dir, Options{MaxCount: 3, Now: clk.now})
	for _, id := range []string{"a", "b", "c"} {
		if _, err := s.Create(id, run(), "h-"+id, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"b", "c", "a"} { // finished in this order
		clk.add(time.Second)
		rd, err := s.Finish(id, []byte(`{"`+id+`":1}`), nil)
		if err != nil {
			t.Fatal(err)
		}
		rd.Close()
	}
	clk.add(time.Second)
	store(t, s, "d", 10) // a fourth: b, the first finished, goes
	if _, ok := s.Get("b"); ok {
		t.Fatal("b, the first finished, was kept")
	}
	for _, id := range []string{"a", "c", "d"} {
		if _, ok := s.Get(id); !ok {
			t.Fatalf("%s evicted before b", id)
		}
	}
	s.Close()

	// After a restart with room for two, c (finished before a and d) goes,
	// though "a" comes first in the database.
	s = open(t, dir, Options{MaxCount: 2, Now: clk.now})
	s.Sweep()
	if _, ok := s.Get("c"); ok {
		t.Fatal("c, the oldest finished, was kept across the restart")
	}
	for _, id := range []string{"a", "d"} {
		if _, ok := s.Get(id); !ok {
			t.Fatalf("%s evicted before c after the restart", id)
		}
	}
}

// An expired answer is gone for readers at once and its files are removed
// by Sweep (the janitor's tick) without any request.
func TestEvictByTTL(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	s := open(t, dir, Options{TTL: time.Minute, Now: clk.now})
	store(t, s, "old", 10)
	clk.add(30 * time.Second)
	store(t, s, "new", 10)
	clk.add(30 * time.Second) // old is exactly a minute old
	if _, ok := s.Get("old"); ok {
		t.Fatal("Get returned an expired answer")
	}
	if len(runDirs(t, dir)) != 2 {
		t.Fatal("files removed before the sweep")
	}
	s.Sweep()
	if runs := runDirs(t, dir); len(runs) != 1 {
		t.Fatalf("after Sweep: %v", runs)
	}
	if _, err := read(t, s, "new"); err != nil {
		t.Fatal(err)
	}
	// The expired id is free again.
	if _, err := s.Create("old", run(), "h", nil); err != nil {
		t.Fatal(err)
	}
}

// The janitor runs on its own: an answer past its TTL disappears from disk
// with no call into the store.
func TestJanitorEnforcesTTL(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{MaxBytes: 1 << 20, MaxCount: 10, TTL: 50 * time.Millisecond, JanitorInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	store(t, s, "x", 10)
	for deadline := time.Now().Add(10 * time.Second); len(runDirs(t, dir)) > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the janitor never removed the expired answer")
		}
	}
	if n, b := s.Stats(); n != 0 || b != 0 {
		t.Fatalf("stats after the janitor: %d %d", n, b)
	}
}

// A Reader opened before an eviction still serves the whole answer.
func TestReaderOutlivesEviction(t *testing.T) {
	clk := newClock()
	s := open(t, t.TempDir(), Options{TTL: time.Minute, Now: clk.now})
	want := store(t, s, "r", 100000)
	rd, err := s.Open("r")
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	clk.add(time.Hour)
	s.Sweep()
	var b bytes.Buffer
	if _, err := rd.WriteTo(&b); err != nil || b.String() != want {
		t.Fatalf("after eviction: %v, %d bytes", err, b.Len())
	}
	// The last Reader's Close removes the evicted answer's files.
	if dirs := runDirs(t, s.dir); len(dirs) != 1 {
		t.Fatalf("run directories while read: %v", dirs)
	}
	rd.Close()
	if dirs := runDirs(t, s.dir); len(dirs) != 0 {
		t.Fatalf("the evicted answer's files outlived its last Reader: %v", dirs)
	}
}

// Finished answers survive a restart (Close, Open); an execution pending at
// the restart is answered by Interrupted, with the restart's time; stray
// files are removed.
func TestRestart(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	s, err := Open(dir, Options{MaxBytes: 1 << 20, MaxCount: 10, TTL: time.Hour, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	want := store(t, s, "done", 5000)
	s.Create("running", "run-00c0ffee", "h-running", []byte(`"info"`))
	f, _ := s.CreatePart("running", 0) // partial output of the dead run
	f.Write([]byte("partial"))
	f.Close()
	s.Close()
	os.MkdirAll(filepath.Join(dir, "run-0000dead"), 0o700) // a run never recorded

	clk.add(10 * time.Minute)
	restart := clk.now()
	var seen []Entry
	s = open(t, dir, Options{Now: clk.now, Interrupted: func(e Entry, now time.Time) []byte {
		seen = append(seen, e)
		return fmt.Appendf(nil, `{"status":"interrupted","at":%q}`, now.Format(time.RFC3339))
	}})
	if got, err := read(t, s, "done"); err != nil || got != want {
		t.Fatalf("finished answer after restart: %v %q", err, got)
	}
	if len(seen) != 1 || seen[0].ID != "running" || string(seen[0].Info) != `"info"` {
		t.Fatalf("Interrupted saw %+v", seen)
	}
	got, err := read(t, s, "running")
	if err != nil || got != fmt.Sprintf(`{"status":"interrupted","at":%q}`, restart.Format(time.RFC3339)) {
		t.Fatalf("interrupted answer: %v %q", err, got)
	}
	if e, _ := s.Get("running"); !e.FinishedAt.Equal(restart) || e.BodyHash != "h-running" || len(e.Holes) != 0 {
		t.Errorf("interrupted entry %+v", e)
	}
	if _, err := os.Stat(filepath.Join(dir, "run-0000dead")); !os.IsNotExist(err) {
		t.Error("stray run directory kept")
	}
	if _, err := os.Stat(filepath.Join(dir, "run-00c0ffee", "part-0")); !os.IsNotExist(err) {
		t.Error("the dead run's partial part kept")
	}
	// The TTL counts across restarts.
	clk.add(50 * time.Minute)
	if _, ok := s.Get("done"); ok {
		t.Error("done outlived its TTL across the restart")
	}
	if _, ok := s.Get("running"); !ok {
		t.Error("the interrupted answer's TTL runs from the restart")
	}
}

// A result whose files are gone (a host crash between syncs) is dropped at
// Open rather than served truncated.
func TestRestartDropsDamagedResult(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{})
	store(t, s, "ok", 10)
	store(t, s, "lost", 10)
	e, _ := s.Get("lost")
	s.Close()
	os.Truncate(filepath.Join(dir, e.Run, "part-0"), 3)
	s = open(t, dir, Options{})
	if _, err := s.Open("lost"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("damaged result: %v", err)
	}
	if _, err := read(t, s, "ok"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, e.Run)); !os.IsNotExist(err) {
		t.Error("the damaged result's files kept")
	}
}

// A damaged database is moved aside and the store starts empty.
func TestDamagedDatabase(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, dbName), bytes.Repeat([]byte("garbage!"), 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	s := open(t, dir, Options{})
	store(t, s, "fresh", 10)
	if m, _ := filepath.Glob(filepath.Join(dir, dbName+".damaged-*")); len(m) != 1 {
		t.Fatalf("moved-aside database: %v", m)
	}
}

// Two stores on one directory would evict each other's files.
func TestOneStorePerDirectory(t *testing.T) {
	dir := t.TempDir()
	open(t, dir, Options{})
	_, err := Open(dir, Options{MaxBytes: 1, MaxCount: 1, TTL: time.Hour})
	if err == nil || !strings.Contains(err.Error(), "another worker") {
		t.Fatalf("second Open = %v", err)
	}
}

func TestClosed(t *testing.T) {
	s := open(t, t.TempDir(), Options{})
	store(t, s, "x", 1)
	s.Close()
	if _, err := s.Open("x"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Open after Close = %v", err)
	}
	if _, err := s.Create("y", run(), "", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Create after Close = %v", err)
	}
}

// BenchmarkExecutionRecord is the store's cost per execution without
// artifacts: the pending record, the answer (a 1 KiB text) and its reading.
func BenchmarkExecutionRecord(b *testing.B) {
	s, err := Open(b.TempDir(), Options{MaxBytes: 1 << 30, MaxCount: 1000, TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	text := bytes.Repeat([]byte("x"), 1024)
	for i := range b.N {
		id := fmt.Sprintf("id-%d", i)
		if _, err := s.Create(id, fmt.Sprintf("run-%08x", i), "h", nil); err != nil {
			b.Fatal(err)
		}
		rd, err := s.Finish(id, text, nil)
		if err != nil {
			b.Fatal(err)
		}
		rd.WriteTo(io.Discard)
		rd.Close()
	}
}

// A small answer without parts lives in the database: no directory, and it
// survives a restart and goes with its record.
func TestSmallAnswerInDatabase(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	s := open(t, dir, Options{TTL: time.Minute, Now: clk.now})
	s.Create("small", "run-00005a11", "h", nil)
	f, _ := s.CreatePart("small", 0) // written, then refused by the caller
	f.Close()
	text := []byte(`{"stdout":"hi\n"}`)
	rd, err := s.Finish("small", text, nil)
	if err != nil {
		t.Fatal(err)
	}
	rd.Close()
	big := bytes.Repeat([]byte("b"), inlineMax+1)
	s.Create("big", "run-0000b1b1", "h", nil)
	if rd, err = s.Finish("big", big, nil); err != nil {
		t.Fatal(err)
	}
	rd.Close()
	if runs := runDirs(t, dir); len(runs) != 1 || runs[0] != "run-0000b1b1" {
		t.Fatalf("run directories: %v (only the big answer's expected)", runs)
	}
	s.Close()
	s = open(t, dir, Options{TTL: time.Minute, Now: clk.now})
	if got, err := read(t, s, "small"); err != nil || got != string(text) {
		t.Fatalf("small answer after restart: %v %q", err, got)
	}
	if got, err := read(t, s, "big"); err != nil || got != string(big) {
		t.Fatalf("big answer after restart: %v, %d bytes", err, len(got))
	}
	if _, b := s.Stats(); b != int64(len(text)+len(big)) {
		t.Fatalf("bytes = %d", b)
	}
	clk.add(time.Minute)
	s.Sweep()
	s.Close()
	s = open(t, dir, Options{TTL: time.Minute, Now: clk.now})
	if n, _ := s.Stats(); n != 0 {
		t.Fatalf("%d answers after their TTL", n)
	}
	s.db.View(func(tx *bolt.Tx) error {
		if n := tx.Bucket(textsBucket).Stats().KeyN; n != 0 {
			t.Errorf("%d texts left in the database", n)
		}
		return nil
	})
}

// One record that does not decode (a bit flipped in a host crash) is
// dropped alone: the other answers survive and nothing is moved aside.
func TestRestartDropsOneBadRecord(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, Options{})
	want := store(t, s, "good", 10)
	store(t, s, "bad", 10)
	bad, _ := s.Get("bad")
	s.Close()
	db, err := bolt.Open(filepath.Join(dir, dbName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte("bad"), []byte("{not json")) }); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s = open(t, dir, Options{})
	if got, err := read(t, s, "good"); err != nil || got != want {
		t.Fatalf("the good answer after a bad record: %v %q", err, got)
	}
	if _, err := s.Open("bad"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the bad record: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, dbName+".damaged-*")); len(m) != 0 {
		t.Fatalf("the whole database was moved aside for one record: %v", m)
	}
	if _, err := os.Stat(filepath.Join(dir, bad.Run)); !os.IsNotExist(err) {
		t.Errorf("the bad record's files are kept (%v): removed as strays", err)
	}
	s.Close()
	s = open(t, dir, Options{})
	if _, ok := s.Get("bad"); ok {
		t.Error("the bad record came back after a restart")
	}
}

// OpenIf checks the hash on the entry it opens: once an id expired and was
// taken by another request, a retry of the first request is told so (never
// served the other's answer, never a pending error), and the new request's
// retry gets its own answer.
func TestOpenIfChecksTheEntryItOpens(t *testing.T) {
	clk := newClock()
	s := open(t, t.TempDir(), Options{TTL: time.Minute, Now: clk.now})
	want := store(t, s, "x", 10) // body hash "h-x"
	if _, e, err := s.OpenIf("x", "h-other"); !errors.Is(err, ErrOtherRequest) || e.BodyHash != "h-x" {
		t.Fatalf("OpenIf with another hash = %+v %v", e, err)
	}
	rd, e, err := s.OpenIf("x", "h-x")
	if err != nil || !e.Final() {
		t.Fatalf("OpenIf = %+v %v", e, err)
	}
	var b bytes.Buffer
	rd.WriteTo(&b)
	rd.Close()
	if b.String() != want {
		t.Fatalf("OpenIf served %q, want %q", b.String(), want)
	}

	clk.add(time.Hour) // expired: the id is free and another request takes it
	if _, err := s.Create("x", run(), "h-new", nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.OpenIf("x", "h-x"); !errors.Is(err, ErrOtherRequest) {
		t.Fatalf("the first request's retry once the id was taken again: %v", err)
	}
	if _, e, err := s.OpenIf("x", "h-new"); !errors.Is(err, ErrPending) || e.BodyHash != "h-new" {
		t.Fatalf("the new request's retry while it runs: %+v %v", e, err)
	}
	if _, _, err := s.OpenIf("nothing", "h"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("OpenIf of an unknown id: %v", err)
	}
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	return len(fds)
}

// fdWatcher is a writer that records the most fds open while it is written.
type fdWatcher struct {
	t   *testing.T
	max int
	buf bytes.Buffer
}

func (w *fdWatcher) Write(b []byte) (int, error) {
	w.max = max(w.max, openFDs(w.t))
	return w.buf.Write(b)
}

// SECURITY.md case 31: an answer with many artifacts costs a stream at most
// two fds (its text and the part being sent), not one per artifact, so slow
// readers cannot exhaust the worker's fds.
func TestReaderHoldsAtMostTwoFiles(t *testing.T) {
	s := open(t, t.TempDir(), Options{MaxBytes: 1 << 30})
	const parts = 32
	if _, err := s.Create("many", run(), "h", nil); err != nil {
		t.Fatal(err)
	}
	var text []byte
	var holes []int64
	text = append(text, '[')
	for i := range parts {
		f, err := s.CreatePart("many", i)
		if err != nil {
			t.Fatal(err)
		}
		f.Write(bytes.Repeat([]byte{byte(i)}, 3*chunk))
		f.Close()
		text = append(text, '"')
		holes = append(holes, int64(len(text)))
		text = append(text, `",`...)
	}
	text = append(text, ']')
	rd, err := s.Finish("many", text, holes)
	if err != nil {
		t.Fatal(err)
	}
	rd.Close()

	before := openFDs(t)
	rd, err = s.Open("many")
	if err != nil {
		t.Fatal(err)
	}
	if n := openFDs(t) - before; n > 1 {
		t.Errorf("an opened answer holds %d fds, want at most 1", n)
	}
	w := &fdWatcher{t: t}
	if _, err := rd.WriteTo(w); err != nil {
		t.Fatal(err)
	}
	if n := w.max - before; n > 2 {
		t.Errorf("a streaming answer held %d fds, want at most 2", n)
	}
	rd.Close()
	if n := openFDs(t) - before; n != 0 {
		t.Errorf("%d fds left open after Close", n)
	}
	if w.buf.Len() != int(rd.Len()) {
		t.Errorf("wrote %d bytes, Len %d", w.buf.Len(), rd.Len())
	}
}

// MaxReaders bounds the answers open at once: beyond it Open and OpenIf
// say ErrBusy; Finish's own answer is never refused; a Close frees a turn.
func TestMaxReaders(t *testing.T) {
	s := open(t, t.TempDir(), Options{MaxReaders: 2})
	store(t, s, "a", 10)
	var rds []*Reader
	for range 2 {
		rd, err := s.Open("a")
		if err != nil {
			t.Fatal(err)
		}
		rds = append(rds, rd)
	}
	if _, err := s.Open("a"); !errors.Is(err, ErrBusy) {
		t.Fatalf("Open beyond MaxReaders = %v, want ErrBusy", err)
	}
	if _, _, err := s.OpenIf("a", "h-a"); !errors.Is(err, ErrBusy) {
		t.Fatalf("OpenIf beyond MaxReaders = %v, want ErrBusy", err)
	}
	store(t, s, "b", 10) // Finish opens b's answer anyway
	rds[0].Close()
	rds[0].Close() // idempotent: frees one turn, not two
	if _, err := read(t, s, "a"); err != nil {
		t.Fatalf("Open after a Close: %v", err)
	}
	rd, err := s.Open("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open("a"); !errors.Is(err, ErrBusy) {
		t.Fatalf("a second Close freed a turn: %v", err)
	}
	rd.Close()
	rds[1].Close()
}
