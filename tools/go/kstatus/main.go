// Command kstatus is the test oracle for gitops-agent's health rules (agent/plan/health.py):
// it reads a JSON array of Kubernetes objects on standard input and prints, as a JSON array on
// standard output, what sigs.k8s.io/cli-utils' kstatus computes for each, in the same order:
// {"status": "Current", "message": "..."}, or {"status": "Error", "message": "..."} when
// kstatus refuses the object. tests/test_health_oracle.py compares these with ours.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err)
	}
	// The API machinery's decoder, as a client's: whole numbers are int64, as kstatus expects.
	var objects []map[string]interface{}
	if err := utiljson.Unmarshal(in, &objects); err != nil {
		fail(fmt.Errorf("standard input is not a JSON array of objects: %w", err))
	}
	out := make([]verdict, 0, len(objects))
	for _, o := range objects {
		res, err := status.Compute(&unstructured.Unstructured{Object: o})
		if err != nil {
			out = append(out, verdict{Status: "Error", Message: err.Error()})
			continue
		}
		out = append(out, verdict{Status: res.Status.String(), Message: res.Message})
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kstatus:", err)
	os.Exit(2)
}
