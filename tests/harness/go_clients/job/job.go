// Package job is what every Go client program reads (one produce job on stdin) and prints
// (what the application got for each record) as JSON lines; see tests/harness/client_programs.py.
package job

import (
	"encoding/json"
	"fmt"
	"os"
)

// Record is one record to produce; a nil Key is a record without a key.
type Record struct {
	Key   *string `json:"key"`
	Value string  `json:"value"`
}

// Job is the records to produce to partition 0 of Topic, in one batch.
type Job struct {
	Bootstrap string   `json:"bootstrap"`
	Topic     string   `json:"topic"`
	Records   []Record `json:"records"`
}

// Result holds, for each record in order, the error's text and Go type (nil: stored).
type Result struct {
	Errors []*string `json:"errors"`
	Types  []*string `json:"types"`
}

// Read reads the job from stdin.
func Read() Job {
	var work Job
	if err := json.NewDecoder(os.Stdin).Decode(&work); err != nil {
		panic(err)
	}
	return work
}

// NewResult is a result for n records, all stored until Fail says otherwise.
func NewResult(n int) *Result {
	return &Result{make([]*string, n), make([]*string, n)}
}

// Fail records what record n's error was.
func (r *Result) Fail(n int, err error) {
	text, kind := err.Error(), fmt.Sprintf("%T", err)
	r.Errors[n], r.Types[n] = &text, &kind
}

// Print writes the result as one JSON line on stdout.
func (r *Result) Print() {
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		panic(err)
	}
}
