package nsjail

import "time"

// Status is the outcome of one execution.
type Status string

const (
	// StatusSucceeded: the command exited 0.
	StatusSucceeded Status = "succeeded"
	// StatusFailed: a non-zero exit, or death by a signal we did not send.
	StatusFailed Status = "failed"
	// StatusTimeout: the wall-clock deadline passed and we killed the tree.
	StatusTimeout Status = "timeout"
	// StatusOOM: the kernel's OOM killer killed a process of the sandbox
	// (read from the cgroup's own counter, not guessed from exit code 137).
	StatusOOM Status = "oom"
	// StatusCancelled: the caller's context was cancelled and we killed the tree.
	StatusCancelled Status = "cancelled"
	// StatusSandboxError: our own failure; Result.Error says what.
	StatusSandboxError Status = "sandbox_error"
)

// Limit names reported in Result.LimitsHit.
const (
	LimitMemory  = "memory"
	LimitPids    = "pids"
	LimitTimeout = "timeout"
	LimitStdout  = "stdout"
	LimitStderr  = "stderr"
)

// Usage is what the execution consumed, as the kernel accounted it.
type Usage struct {
	WallMS int64 `json:"wall_ms"`
	CPUMS  int64 `json:"cpu_ms"`
	// PeakMemoryBytes is the cgroup's high-water mark (v1
	// memory.max_usage_in_bytes, v2 memory.peak); 0 where the kernel has none.
	PeakMemoryBytes int64 `json:"peak_memory_bytes"`
	// PidsPeak is the highest number of tasks seen (v2 pids.peak, kernel
	// 6.1+); on v1 it is sampled and may miss short spikes.
	PidsPeak int64 `json:"pids_peak"`
}

// Result is the typed outcome of Runner.Run.
type Result struct {
	ID       string `json:"id"`
	Status   Status `json:"status"`
	ExitCode int    `json:"exit_code"`
	// Signal is the name of the signal that ended the command ("SIGKILL"),
	// empty when it exited.
	Signal    string   `json:"signal,omitempty"`
	LimitsHit []string `json:"limits_hit"`
	Stdout    []byte   `json:"-"`
	Stderr    []byte   `json:"-"`
	// StdoutTruncated and StderrTruncated say a stream went past its cap;
	// StdoutBytes and StderrBytes count everything the command wrote.
	StdoutTruncated bool      `json:"stdout_truncated"`
	StderrTruncated bool      `json:"stderr_truncated"`
	StdoutBytes     int64     `json:"stdout_bytes"`
	StderrBytes     int64     `json:"stderr_bytes"`
	Usage           Usage     `json:"usage"`
	StartedAt       time.Time `json:"started_at"`
	FinishedAt      time.Time `json:"finished_at"`
	// Error explains StatusSandboxError.
	Error string `json:"error,omitempty"`
	// Ended, when not nil, closes once the sandbox's processes are gone:
	// Wait answered on its command's done word (Spec.Done) and kills it
	// afterwards. Until then it still holds its memory (and its
	// teardown's CPU): a caller that admits executions by what they may
	// use holds the slot until Ended closes. Nil when the end came first.
	Ended <-chan struct{} `json:"-"`
}
