package main

import (
	"encoding/xml"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Outcome of one test case as pytest's JUnit XML reports it.
type Outcome string

const (
	Passed  Outcome = "passed"
	Failed  Outcome = "failed" // <failure> (or xpass strict)
	Errored Outcome = "error"  // <error>: setup/teardown or collection
	Skipped Outcome = "skipped"
	// Missing: the test ran on one side only (on the other the run died,
	// timed out or collected differently). Never "passed".
	Missing Outcome = "missing"
)

type junitCase struct {
	Classname string    `xml:"classname,attr"`
	Name      string    `xml:"name,attr"`
	Failure   *struct{} `xml:"failure"`
	Error     *struct{} `xml:"error"`
	Skipped   *struct{} `xml:"skipped"`
}

type junitSuite struct {
	Cases []junitCase `xml:"testcase"`
}

// ParseJUnit reads pytest's --junit-xml output (one <testsuites> with one
// or more <testsuite>) into outcome by test id ("classname::name"). A case
// reported twice (a test that fails in call and errors in teardown) keeps
// the worst outcome.
func ParseJUnit(r io.Reader) (map[string]Outcome, error) {
	var doc struct {
		XMLName xml.Name
		Suites  []junitSuite `xml:"testsuite"`
		Cases   []junitCase  `xml:"testcase"` // a bare <testsuite> root
	}
	if err := xml.NewDecoder(r).Decode(&doc); err != nil {
		return nil, fmt.Errorf("junit xml: %w", err)
	}
	cases := doc.Cases
	for _, s := range doc.Suites {
		cases = append(cases, s.Cases...)
	}
	out := make(map[string]Outcome, len(cases))
	for _, c := range cases {
		o := Passed
		switch {
		case c.Error != nil:
			o = Errored
		case c.Failure != nil:
			o = Failed
		case c.Skipped != nil:
			o = Skipped
		}
		id := c.Classname + "::" + c.Name
		if prev, ok := out[id]; !ok || rank(o) > rank(prev) {
			out[id] = o
		}
	}
	return out, nil
}

func rank(o Outcome) int {
	switch o {
	case Passed:
		return 0
	case Skipped:
		return 1
	case Failed:
		return 2
	}
	return 3
}

// Comparison of one suite's outcomes outside and inside the sandbox.
type Comparison struct {
	Suite string
	// Counts per outcome on each side.
	Outside, Inside map[Outcome]int
	// Regressions passed outside and did not pass inside (failed, errored,
	// skipped or missing): what the sandbox must never cause.
	Regressions []string
	// Gained passed inside only (flaky, or an outside-only problem).
	Gained []string
	// Flaky were regressions that passed when run again inside.
	Flaky []string
}

// Compare lines up the two runs of a suite.
func Compare(suite string, outside, inside map[string]Outcome) Comparison {
	c := Comparison{Suite: suite, Outside: map[Outcome]int{}, Inside: map[Outcome]int{}}
	ids := map[string]bool{}
	for id := range outside {
		ids[id] = true
	}
	for id := range inside {
		ids[id] = true
	}
	for id := range ids {
		o, ok := outside[id]
		if !ok {
			o = Missing
		}
		i, ok := inside[id]
		if !ok {
			i = Missing
		}
		c.Outside[o]++
		c.Inside[i]++
		switch {
		case o == Passed && i != Passed:
			c.Regressions = append(c.Regressions, fmt.Sprintf("%s (inside: %s)", id, i))
		case i == Passed && o != Passed:
			c.Gained = append(c.Gained, fmt.Sprintf("%s (outside: %s)", id, o))
		}
	}
	sort.Strings(c.Regressions)
	sort.Strings(c.Gained)
	return c
}

// Report is the comparison as markdown: one row per suite, then what the
// image does not have (absent: "pyarrow: not in this image"), then every
// regression and every test that passed inside only.
func Report(comps []Comparison, absent []string) string {
	var b strings.Builder
	b.WriteString("| suite | tests | passed outside | passed inside | failed+errors outside | failed+errors inside | skipped outside | skipped inside | regressions |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	total := map[string]int{}
	for _, c := range comps {
		n := 0
		for _, v := range c.Outside {
			n += v
		}
		row := []int{n, c.Outside[Passed], c.Inside[Passed],
			c.Outside[Failed] + c.Outside[Errored], c.Inside[Failed] + c.Inside[Errored],
			c.Outside[Skipped], c.Inside[Skipped], len(c.Regressions)}
		fmt.Fprintf(&b, "| %s |", c.Suite)
		for i, v := range row {
			fmt.Fprintf(&b, " %d |", v)
			total[fmt.Sprint(i)] += v
		}
		b.WriteString("\n")
	}
	b.WriteString("| **all** |")
	for i := range 8 {
		fmt.Fprintf(&b, " %d |", total[fmt.Sprint(i)])
	}
	b.WriteString("\n")
	for _, a := range absent {
		fmt.Fprintf(&b, "\n%s", a)
	}
	for _, c := range comps {
		for _, r := range c.Regressions {
			fmt.Fprintf(&b, "\nREGRESSION %s: %s", c.Suite, r)
		}
		for _, f := range c.Flaky {
			fmt.Fprintf(&b, "\nflaky (passed inside when run again) %s: %s", c.Suite, f)
		}
		for _, g := range c.Gained {
			fmt.Fprintf(&b, "\npassed inside only %s: %s", c.Suite, g)
		}
	}
	b.WriteString("\n")
	return b.String()
}
