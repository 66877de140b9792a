// Package results keeps the answers of executions on disk, within a byte
// budget, a count and a time to live, and serves them back as streams: an
// answer is never held whole in memory, however many clients read it at once
// (SECURITY.md case 31: a client fills the worker's memory with large
// results).
//
// Layout under the store's directory:
//
//	results.db        bbolt: one record (an Entry, as JSON) per execution id,
//	                  and the text of small answers without parts
//	run-…/doc.json    the answer: a JSON text with holes
//	run-…/part-N      the file whose base64 fills hole N (an artifact)
//
// An execution is recorded when it is admitted (pending) and again when it
// finishes (final). A record still pending at Open belonged to a worker that
// died: Options.Interrupted writes its answer. The directory is named by the
// worker-generated run name, never by the client's id, so an id reused after
// its result expired cannot meet the old files.
//
// Commits are not fsynced one by one (bbolt's NoSync): they reach the page
// cache before the call returns, so they survive the worker's death (SIGKILL,
// OOM kill, restart), which is what the store promises. The janitor syncs
// the database every interval and Close syncs it; a host crash can lose the
// last interval's records, and a database it damaged is moved aside at Open.
// A synced commit costs two fdatasyncs (~7 ms on the reference VM's disk),
// more than a whole warm execution.
package results

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

const (
	dbName  = "results.db"
	docName = "doc.json"
	// partPrefix + the hole's index names a part file.
	partPrefix = "part-"
)

var (
	bucket      = []byte("executions")
	textsBucket = []byte("texts") // id → the text of an Inline answer
)

// inlineMax is the largest answer kept in the database rather than in files:
// an answer without artifacts then costs no directory and no file (their
// creation was most of the store's cost per execution), and the database
// stays small (at most results_max × inlineMax), so that reading it through
// bbolt's mmap adds little to the worker's resident memory.
const inlineMax = 16 << 10

// runPattern is what a run name must look like: it names a directory. It is
// compiled on first use, not when the package is initialised: every sandbox's
// init (sandboxd re-executed by libcontainer) initialises this package before
// it hands over, and would pay ~45 KiB in ~570 allocations for nothing.
var runPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^run-[0-9a-f]{8,64}$`) })

// ValidRun reports whether name is a run name: "run-" and 8 to 64 lower-case
// hex digits.
func ValidRun(name string) bool { return runPattern().MatchString(name) }

var (
	// ErrExists: the id is taken by a pending or unexpired final execution.
	ErrExists = errors.New("an execution with this id exists")
	// ErrNotFound: no such execution, or its result expired.
	ErrNotFound = errors.New("no such execution (unknown, or its result has expired)")
	// ErrPending: the execution has no answer yet.
	ErrPending = errors.New("the execution has not finished")
	// ErrOtherRequest: the id is taken by a request with another body hash.
	ErrOtherRequest = errors.New("the execution with this id is another request's")
	// ErrBusy: Options.MaxReaders answers are being read already.
	ErrBusy = errors.New("too many answers are being read at once")
	// ErrClosed: the store is closed.
	ErrClosed = errors.New("the result store is closed")
)

// Entry is what the store records of one execution.
type Entry struct {
	// ID is the client's (or a generated) execution id.
	ID string `json:"id"`
	// Run is the worker-generated name of this execution (ValidRun); it
	// names the directory.
	Run string `json:"run"`
	// BodyHash identifies the request, so a retry can be told from a
	// different request that reuses the id.
	BodyHash string `json:"body_hash"`
	// Info is the caller's own data (kept for Options.Interrupted).
	Info json.RawMessage `json:"info,omitempty"`
	// CreatedAt is when the execution was admitted.
	CreatedAt time.Time `json:"created_at"`
	// FinishedAt is when the answer was stored; zero while pending.
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// TextBytes is the size of doc.json; Holes are offsets in it, one per
	// part, ascending; PartBytes are the parts' sizes.
	TextBytes int64   `json:"text_bytes,omitempty"`
	Holes     []int64 `json:"holes,omitempty"`
	PartBytes []int64 `json:"part_bytes,omitempty"`
	// Inline: the text is in the database (no parts, at most inlineMax).
	Inline bool `json:"inline,omitempty"`
}

// Final reports whether the execution's answer is stored.
func (e *Entry) Final() bool { return !e.FinishedAt.IsZero() }

// Size is the bytes the answer holds on disk: the text and the parts (the
// record itself, a few hundred bytes, is not counted).
func (e *Entry) Size() int64 {
	n := e.TextBytes
	for _, p := range e.PartBytes {
		n += p
	}
	return n
}

// Options bound the store. MaxBytes, MaxCount and TTL are required.
type Options struct {
	// MaxBytes bounds the finished answers' Size, all together.
	MaxBytes int64
	// MaxCount bounds the number of finished answers.
	MaxCount int
	// TTL is how long an answer is kept after it finished.
	TTL time.Duration
	// JanitorInterval is how often expired answers are removed and the
	// database synced; 0 means TTL/4, between 10ms and 10s.
	JanitorInterval time.Duration
	// Now is the clock (time.Now when nil); tests inject theirs.
	Now func() time.Time
	// Logger receives evictions' and recoveries' errors (none when nil).
	Logger *slog.Logger
	// MaxReaders bounds the Readers open at once that Open and OpenIf
	// return (ErrBusy beyond; 0: no bound). Finish's Reader, the answer of
	// the execution that just ran, counts but is never refused.
	MaxReaders int
	// Interrupted returns the answer (a JSON text without holes) of an
	// execution found pending at Open: its worker died. now is the
	// answer's FinishedAt. When nil such executions are dropped.
	Interrupted func(e Entry, now time.Time) []byte
}

// Store is the result store. Its methods are safe for concurrent use.
type Store struct {
	dir  string
	db   *bolt.DB
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	entries  map[string]*Entry
	finished []*Entry // oldest first
	bytes    int64    // Size of the finished, together
	dirty    bool     // a commit since the last sync
	closed   bool
	// Open Readers: their count, and per run directory; a run evicted
	// while read is removed by its last Reader's Close (removeRuns).
	open      int
	reading   map[string]int
	evictedRd map[string]bool

	stop    chan struct{}
	stopped chan struct{}
}

// Open opens (or creates) the store in dir: it loads the records, answers
// the executions a dead worker left pending (Options.Interrupted), removes
// files no record refers to and what is over the bounds, and starts the
// janitor. Only one Store may use dir at a time: a second Open fails after
// a second.
func Open(dir string, opts Options) (*Store, error) {
	if opts.MaxBytes <= 0 || opts.MaxCount <= 0 || opts.TTL <= 0 {
		return nil, fmt.Errorf("results: MaxBytes, MaxCount and TTL must be > 0, got %d, %d, %s", opts.MaxBytes, opts.MaxCount, opts.TTL)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.JanitorInterval <= 0 {
		opts.JanitorInterval = min(max(opts.TTL/4, 10*time.Millisecond), 10*time.Second)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("results dir: %w", err)
	}
	s := &Store{dir: dir, opts: opts, log: log, entries: map[string]*Entry{},
		reading: map[string]int{}, evictedRd: map[string]bool{},
		stop: make(chan struct{}), stopped: make(chan struct{})}
	db, err := openDB(filepath.Join(dir, dbName), log)
	if err != nil {
		return nil, err
	}
	s.db = db
	if err := s.load(); err != nil {
		db.Close()
		return nil, err
	}
	s.removeStrays()
	s.recover()
	s.mu.Lock()
	runs := s.evictLocked()
	s.mu.Unlock()
	s.removeRuns(runs)
	if err := s.db.Sync(); err != nil {
		db.Close()
		return nil, fmt.Errorf("results: sync %s: %w", dbName, err)
	}
	go s.janitor()
	return s, nil
}

// openDB opens the database, or, when it is damaged (a host crash between
// syncs), moves it aside and starts an empty one.
func openDB(path string, log *slog.Logger) (*bolt.DB, error) {
	opts := &bolt.Options{Timeout: time.Second, NoSync: true}
	db, err := bolt.Open(path, 0o600, opts)
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("results: %s is locked: another worker uses this results_dir", path)
	}
	if err == nil {
		err = check(db)
		if err != nil {
			db.Close()
		}
	}
	if err == nil {
		return db, nil
	}
	var pathErr *os.PathError
	if errors.As(err, &pathErr) {
		return nil, fmt.Errorf("results: %w", err) // not damage: permissions, space
	}
	aside := fmt.Sprintf("%s.damaged-%d", path, time.Now().Unix())
	log.Error("result store damaged: moved aside, starting empty", "db", path, "moved_to", aside, "err", err)
	if rerr := os.Rename(path, aside); rerr != nil {
		return nil, fmt.Errorf("results: %s is damaged (%v) and cannot be moved aside: %w", path, err, rerr)
	}
	db, err = bolt.Open(path, 0o600, opts)
	if err == nil {
		if err = check(db); err != nil {
			db.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("results: %w", err)
	}
	return db, nil
}

// check verifies the database's pages and creates its buckets. The records
// are load's: one that does not decode is dropped alone, not the database.
func check(db *bolt.DB) (err error) {
	defer func() {
		if p := recover(); p != nil { // bbolt panics on some damaged pages
			err = fmt.Errorf("reading the database: %v", p)
		}
	}()
	err = db.View(func(tx *bolt.Tx) error {
		var errs []error
		for err := range tx.Check() { // drained: the checker blocks on it
			if len(errs) < 5 {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
	if err != nil {
		return err
	}
	return db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(textsBucket); err != nil {
			return err
		}
		_, err := tx.CreateBucketIfNotExists(bucket)
		return err
	})
}

// load reads every record into memory. A record that does not decode, and a
// final record whose files are not what it says (lost in a host crash), are
// dropped one by one and logged; the others are kept.
func (s *Store) load() error {
	var drop []*Entry
	err := s.db.View(func(tx *bolt.Tx) error {
		texts := tx.Bucket(textsBucket)
		return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
			e := &Entry{}
			err := json.Unmarshal(v, e)
			if err == nil && (e.ID != string(k) || !ValidRun(e.Run) || len(e.Holes) != len(e.PartBytes)) {
				err = errors.New("inconsistent fields")
			}
			if err != nil {
				// Its files, not referred to by any record, go as strays.
				s.log.Error("result store: dropping an invalid record", "key", clipKey(k), "err", err)
				drop = append(drop, &Entry{ID: string(k)})
				return nil
			}
			if e.Final() {
				err := s.checkFiles(e)
				if e.Inline && int64(len(texts.Get(k))) != e.TextBytes {
					err = errors.New("the text is not in the database")
				}
				if err != nil {
					s.log.Error("result store: dropping a result whose files are damaged", "execution_id", e.ID, "err", err)
					drop = append(drop, e)
					return nil
				}
				s.finished = append(s.finished, e)
				s.bytes += e.Size()
			}
			s.entries[e.ID] = e
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("results: load: %w", err)
	}
	slices.SortStableFunc(s.finished, func(a, b *Entry) int { return a.FinishedAt.Compare(b.FinishedAt) })
	s.deleteRecords(drop)
	var runs []string
	for _, e := range drop {
		if e.Run != "" {
			runs = append(runs, e.Run)
		}
	}
	s.removeRuns(runs)
	return nil
}

// checkFiles verifies that e's files have the sizes recorded.
func (s *Store) checkFiles(e *Entry) error {
	want := map[string]int64{}
	if !e.Inline {
		want[docName] = e.TextBytes
	}
	for i, n := range e.PartBytes {
		want[partName(i)] = n
	}
	for name, n := range want {
		fi, err := os.Lstat(filepath.Join(s.dir, e.Run, name))
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() || fi.Size() != n {
			return fmt.Errorf("%s: %d bytes, recorded %d", name, fi.Size(), n)
		}
	}
	return nil
}

// removeStrays removes the run directories no record refers to (a worker
// died between creating one and recording it, or between dropping a record
// and removing its files).
func (s *Store) removeStrays() {
	names, err := os.ReadDir(s.dir)
	if err != nil {
		s.log.Error("result store: listing", "dir", s.dir, "err", err)
		return
	}
	known := map[string]bool{}
	for _, e := range s.entries {
		known[e.Run] = true
	}
	var runs []string
	for _, n := range names {
		if ValidRun(n.Name()) && !known[n.Name()] {
			runs = append(runs, n.Name())
		}
	}
	s.removeRuns(runs)
}

// recover answers every pending execution: its worker died before it
// finished, so whatever it wrote is removed and Options.Interrupted answers.
func (s *Store) recover() {
	now := s.opts.Now()
	var pending []*Entry
	for _, e := range s.entries {
		if !e.Final() {
			pending = append(pending, e)
		}
	}
	for _, e := range pending {
		s.removeRuns([]string{e.Run})
		if s.opts.Interrupted == nil {
			s.Discard(e.ID)
			continue
		}
		rd, err := s.Finish(e.ID, s.opts.Interrupted(*e, now), nil)
		if err != nil {
			s.log.Error("result store: recording an interrupted execution", "execution_id", e.ID, "err", err)
			s.Discard(e.ID)
			continue
		}
		rd.Close()
	}
}

// Create records a new pending execution. When id is taken it returns the
// existing entry and ErrExists. run must satisfy ValidRun and be unique.
func (s *Store) Create(id, run, bodyHash string, info []byte) (Entry, error) {
	if !ValidRun(run) {
		return Entry{}, fmt.Errorf("results: run name %q is invalid", run)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return Entry{}, ErrClosed
	}
	runs := s.evictLocked() // an expired id is free again
	defer s.removeRuns(runs)
	defer s.mu.Unlock()
	if e, ok := s.entries[id]; ok {
		return *e, ErrExists
	}
	e := &Entry{ID: id, Run: run, BodyHash: bodyHash, Info: info, CreatedAt: s.opts.Now()}
	if err := s.putLocked(e, nil); err != nil {
		return Entry{}, err
	}
	s.entries[id] = e
	return *e, nil
}

// Get returns id's entry, pending or final; an expired one is not found.
func (s *Store) Get(id string) (Entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[id]
	if !ok || e.Final() && s.expired(e, s.opts.Now()) {
		return Entry{}, false
	}
	return *e, true
}

// CreatePart creates (or truncates) the file that fills hole i of the
// pending execution id's answer.
func (s *Store) CreatePart(id string, i int) (*os.File, error) {
	e, ok := s.Get(id)
	if !ok || e.Final() {
		return nil, fmt.Errorf("results: %q is not a pending execution", id)
	}
	dir := filepath.Join(s.dir, e.Run)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("results: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, partName(i)), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("results: %w", err)
	}
	return f, nil
}

// Finish stores the pending execution id's answer: text, whose hole i (an
// offset, ascending) is filled with part i's base64. Parts 0..len(holes)-1
// must have been written through CreatePart; any other file is removed.
// The answer is opened before anything is evicted, so the returned Reader
// serves it even when it is over the bounds itself. On error nothing
// changed: the caller may Discard the execution.
func (s *Store) Finish(id string, text []byte, holes []int64) (*Reader, error) {
	for i, h := range holes {
		if h < 0 || h > int64(len(text)) || i > 0 && h < holes[i-1] {
			return nil, fmt.Errorf("results: hole %d at %d is out of order or outside the text", i, h)
		}
	}
	e, ok := s.Get(id)
	if !ok || e.Final() {
		return nil, fmt.Errorf("results: %q is not a pending execution", id)
	}
	dir := filepath.Join(s.dir, e.Run)
	inline := len(holes) == 0 && len(text) <= inlineMax
	var sizes []int64
	if inline {
		os.RemoveAll(dir) // parts written and then all refused
	} else {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("results: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, docName), text, 0o600); err != nil {
			return nil, fmt.Errorf("results: %w", err)
		}
		var err error
		if sizes, err = s.settleParts(dir, len(holes)); err != nil {
			return nil, err
		}
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	cur := s.entries[id]
	if cur == nil || cur.Run != e.Run || cur.Final() {
		s.mu.Unlock()
		return nil, fmt.Errorf("results: %q changed while it was finishing", id)
	}
	done := *cur
	done.FinishedAt, done.TextBytes, done.Holes, done.PartBytes = s.opts.Now(), int64(len(text)), holes, sizes
	done.Inline = inline
	if !inline {
		text = nil
	}
	if err := s.putLocked(&done, text); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	*cur = done
	s.finished = append(s.finished, cur)
	s.bytes += cur.Size()
	rd, err := s.openLocked(cur)
	runs := s.evictLocked()
	s.mu.Unlock()
	s.removeRuns(runs)
	return rd, err
}

// settleParts returns the sizes of parts 0..n-1 in dir and removes every
// other file there but the text.
func (s *Store) settleParts(dir string, n int) ([]int64, error) {
	sizes := make([]int64, n)
	for i := range sizes {
		fi, err := os.Lstat(filepath.Join(dir, partName(i)))
		if err != nil {
			return nil, fmt.Errorf("results: part %d: %w", i, err)
		}
		sizes[i] = fi.Size()
	}
	names, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("results: %w", err)
	}
	for _, f := range names {
		i, err := strconv.Atoi(strings.TrimPrefix(f.Name(), partPrefix))
		if f.Name() == docName || strings.HasPrefix(f.Name(), partPrefix) && err == nil && i >= 0 && i < n {
			continue
		}
		os.RemoveAll(filepath.Join(dir, f.Name()))
	}
	return sizes, nil
}

// Discard forgets the execution id and removes its files (one that never
// ran, or whose answer could not be stored).
func (s *Store) Discard(id string) {
	s.mu.Lock()
	e, ok := s.entries[id]
	if !ok {
		s.mu.Unlock()
		return
	}
	delete(s.entries, id)
	if e.Final() {
		s.finished = slices.DeleteFunc(s.finished, func(f *Entry) bool { return f == e })
		s.bytes -= e.Size()
	}
	s.deleteRecords([]*Entry{e})
	s.mu.Unlock()
	s.removeRuns([]string{e.Run})
}

// Open opens id's stored answer. ErrNotFound when there is none (or it
// expired), ErrPending while it runs.
func (s *Store) Open(id string) (*Reader, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	runs := s.evictLocked()
	defer s.removeRuns(runs)
	defer s.mu.Unlock()
	e, ok := s.entries[id]
	switch {
	case !ok:
		return nil, ErrNotFound
	case !e.Final():
		return nil, ErrPending
	case s.busyLocked():
		return nil, ErrBusy
	}
	return s.openLocked(e)
}

// busyLocked reports whether Options.MaxReaders Readers are open.
func (s *Store) busyLocked() bool { return s.opts.MaxReaders > 0 && s.open >= s.opts.MaxReaders }

// OpenIf opens id's stored answer if its record has bodyHash, checked and
// opened under one lock: an entry that expired and was taken by another
// request between a check and an open can never be served for this one.
// The entry is returned with ErrPending (still running) and ErrOtherRequest
// (another request's); ErrNotFound when there is none (or it expired).
func (s *Store) OpenIf(id, bodyHash string) (*Reader, Entry, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, Entry{}, ErrClosed
	}
	runs := s.evictLocked()
	defer s.removeRuns(runs)
	defer s.mu.Unlock()
	e, ok := s.entries[id]
	switch {
	case !ok:
		return nil, Entry{}, ErrNotFound
	case e.BodyHash != bodyHash:
		return nil, *e, ErrOtherRequest
	case !e.Final():
		return nil, *e, ErrPending
	case s.busyLocked():
		return nil, *e, ErrBusy
	}
	rd, err := s.openLocked(e)
	return rd, *e, err
}

// openLocked opens e's answer. Its text file stays open; its parts are
// opened one at a time while WriteTo streams (SECURITY.md case 31: a Reader
// holds at most two fds, not one per artifact). Files are removed only after
// their entry has left s.entries (under s.mu), so they exist here, and never
// while a Reader of theirs is open (removeRuns), so an answer evicted while
// it is read is still served whole.
func (s *Store) openLocked(e *Entry) (*Reader, error) {
	r := &Reader{holes: e.Holes, textBytes: e.TextBytes, partBytes: e.PartBytes}
	if e.Inline {
		var text []byte
		err := s.db.View(func(tx *bolt.Tx) error {
			text = bytes.Clone(tx.Bucket(textsBucket).Get([]byte(e.ID))) // valid in the tx only
			return nil
		})
		if err != nil || int64(len(text)) != e.TextBytes {
			return nil, fmt.Errorf("results: the text of %q is missing (%v)", e.ID, err)
		}
		r.text = bytes.NewReader(text)
		return r, nil
	}
	r.dir = filepath.Join(s.dir, e.Run)
	f, err := os.Open(filepath.Join(r.dir, docName))
	if err != nil {
		return nil, fmt.Errorf("results: %w", err)
	}
	r.text, r.textFile = f, f
	r.store, r.run = s, e.Run
	s.open++
	s.reading[e.Run]++
	return r, nil
}

// closeReader forgets a Reader of run, and removes run's files when it was
// the last Reader of an evicted run.
func (s *Store) closeReader(run string) {
	s.mu.Lock()
	s.open--
	s.reading[run]--
	remove := false
	if s.reading[run] <= 0 {
		delete(s.reading, run)
		remove = s.evictedRd[run]
		delete(s.evictedRd, run)
	}
	s.mu.Unlock()
	if remove {
		s.removeRuns([]string{run})
	}
}

// Sweep removes the answers that expired or are over the bounds, oldest
// first. The janitor calls it every interval.
func (s *Store) Sweep() {
	s.mu.Lock()
	runs := s.evictLocked()
	s.mu.Unlock()
	s.removeRuns(runs)
}

func (s *Store) expired(e *Entry, now time.Time) bool { return now.Sub(e.FinishedAt) >= s.opts.TTL }

// evictLocked drops finished answers, oldest first, while the oldest has
// expired or the store is over MaxBytes or MaxCount. Pending executions are
// never evicted. It returns the run directories to remove once s.mu is
// released.
func (s *Store) evictLocked() []string {
	now := s.opts.Now()
	var victims []*Entry
	for len(s.finished) > 0 {
		e := s.finished[0]
		if !s.expired(e, now) && s.bytes <= s.opts.MaxBytes && len(s.finished) <= s.opts.MaxCount {
			break
		}
		s.finished[0] = nil
		s.finished = s.finished[1:]
		s.bytes -= e.Size()
		delete(s.entries, e.ID)
		victims = append(victims, e)
	}
	if len(victims) == 0 {
		return nil
	}
	s.deleteRecords(victims)
	runs := make([]string, len(victims))
	for i, e := range victims {
		runs[i] = e.Run
	}
	return runs
}

// putLocked commits e's record, with its text when it is Inline.
func (s *Store) putLocked(e *Entry, text []byte) error {
	data, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("results: %w", err)
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		if text != nil {
			if err := tx.Bucket(textsBucket).Put([]byte(e.ID), text); err != nil {
				return err
			}
		}
		return tx.Bucket(bucket).Put([]byte(e.ID), data)
	})
	if err != nil {
		return fmt.Errorf("results: record %q: %w", e.ID, err)
	}
	s.dirty = true
	return nil
}

// deleteRecords deletes the entries' records. A failure is logged: the
// files go anyway, and Open drops a record whose files are gone.
func (s *Store) deleteRecords(es []*Entry) {
	if len(es) == 0 {
		return
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, texts := tx.Bucket(bucket), tx.Bucket(textsBucket)
		for _, e := range es {
			if err := errors.Join(b.Delete([]byte(e.ID)), texts.Delete([]byte(e.ID))); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.log.Error("result store: deleting records", "count", len(es), "err", err)
	}
	s.dirty = true
}

// removeRuns removes run directories; one that a Reader has open is removed
// by its last Reader's Close instead. Callers do not hold s.mu.
func (s *Store) removeRuns(runs []string) {
	if len(runs) == 0 {
		return
	}
	s.mu.Lock()
	runs = slices.DeleteFunc(slices.Clone(runs), func(run string) bool {
		if s.reading[run] > 0 {
			s.evictedRd[run] = true
			return true
		}
		return false
	})
	s.mu.Unlock()
	for _, run := range runs {
		if !ValidRun(run) {
			continue // never a path built from anything else
		}
		if err := os.RemoveAll(filepath.Join(s.dir, run)); err != nil {
			s.log.Error("result store: removing files", "run", run, "err", err)
		}
	}
}

// Stats are the finished answers' count and bytes.
func (s *Store) Stats() (count int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.finished), s.bytes
}

// janitor enforces the TTL without waiting for a request, and syncs the
// database, until Close.
func (s *Store) janitor() {
	defer close(s.stopped)
	t := time.NewTicker(s.opts.JanitorInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.Sweep()
		s.mu.Lock()
		dirty := s.dirty
		s.dirty = false
		s.mu.Unlock()
		if dirty {
			if err := s.db.Sync(); err != nil {
				s.log.Error("result store: sync", "err", err)
			}
		}
	}
}

// Close stops the janitor, syncs and closes the database. Readers already
// open stay readable.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stop)
	<-s.stopped
	return errors.Join(s.db.Sync(), s.db.Close())
}

// clipKey is a record's key for a log line: a damaged key may be long.
func clipKey(k []byte) string {
	if len(k) > 128 {
		k = k[:128]
	}
	return strings.ToValidUTF8(string(k), "\uFFFD")
}

func partName(i int) string { return partPrefix + strconv.Itoa(i) }

// Reader is one opened answer. WriteTo writes it; Close releases it.
type Reader struct {
	text      io.ReaderAt
	textFile  *os.File // the text, when it is a file
	dir       string   // the run directory, where the parts are
	store     *Store   // to tell Close (nil for an inline answer)
	run       string
	closed    bool
	holes     []int64
	textBytes int64
	partBytes []int64
}

// Len is the number of bytes WriteTo writes.
func (r *Reader) Len() int64 {
	n := r.textBytes
	for _, p := range r.partBytes {
		n += int64(base64.StdEncoding.EncodedLen(int(p)))
	}
	return n
}

// The copy buffers: every stream holds these two and nothing else of the
// answer. chunk is a multiple of 3, so base64 pads only at a part's end.
const chunk = 3 << 13 // 24 KiB in, 32 KiB out

// WriteTo writes the answer: the text with each hole filled with its part's
// base64, read from disk chunk by chunk.
func (r *Reader) WriteTo(w io.Writer) (int64, error) {
	in := make([]byte, chunk)
	out := make([]byte, base64.StdEncoding.EncodedLen(chunk))
	var written, off int64
	write := func(b []byte) error {
		n, err := w.Write(b)
		written += int64(n)
		return err
	}
	copyText := func(end int64) error {
		for off < end {
			k := min(int64(len(in)), end-off)
			if _, err := r.text.ReadAt(in[:k], off); err != nil {
				return fmt.Errorf("results: text: %w", err)
			}
			if err := write(in[:k]); err != nil {
				return err
			}
			off += k
		}
		return nil
	}
	for i, h := range r.holes {
		if err := copyText(h); err != nil {
			return written, err
		}
		part, err := os.Open(filepath.Join(r.dir, partName(i)))
		if err != nil {
			return written, fmt.Errorf("results: part %d: %w", i, err)
		}
		err = copyPart(part, r.partBytes[i], in, out, write)
		part.Close()
		if err != nil {
			return written, fmt.Errorf("results: part %d: %w", i, err)
		}
	}
	return written, copyText(r.textBytes)
}

// copyPart writes n bytes of part, base64 encoded, through the buffers.
func copyPart(part io.Reader, n int64, in, out []byte, write func([]byte) error) error {
	for left := n; left > 0; {
		k := min(int64(len(in)), left)
		if _, err := io.ReadFull(part, in[:k]); err != nil {
			return err
		}
		m := base64.StdEncoding.EncodedLen(int(k))
		base64.StdEncoding.Encode(out[:m], in[:k])
		if err := write(out[:m]); err != nil {
			return err
		}
		left -= k
	}
	return nil
}

// Close closes the answer's file. It is idempotent.
func (r *Reader) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	var err error
	if r.textFile != nil {
		err = r.textFile.Close()
	}
	if r.store != nil {
		r.store.closeReader(r.run)
	}
	return err
}

// Text is the answer's text as stored, each hole left empty: a JSON text
// with "" where each part's base64 goes when WriteTo fills it.
func (r *Reader) Text() *io.SectionReader { return io.NewSectionReader(r.text, 0, r.textBytes) }

// Holes are the offsets in Text where the parts go, one per part, ascending.
func (r *Reader) Holes() []int64 { return r.holes }

// OpenPart opens part i (the bytes whose base64 fills hole i) for reading
// on its own, without the rest of the answer; the caller closes it. It
// stays readable while r is open, even if its answer is evicted meanwhile.
func (r *Reader) OpenPart(i int) (*os.File, int64, error) {
	if i < 0 || i >= len(r.partBytes) || r.dir == "" {
		return nil, 0, fmt.Errorf("results: no part %d", i)
	}
	f, err := os.Open(filepath.Join(r.dir, partName(i)))
	if err != nil {
		return nil, 0, fmt.Errorf("results: part %d: %w", i, err)
	}
	return f, r.partBytes[i], nil
}
