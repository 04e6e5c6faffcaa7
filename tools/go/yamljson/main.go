// Command yamljson is the YAML oracle of tests/test_yaml_oracle.py, built by scripts/install-go-tools:
// it reads a YAML stream on standard input, cuts it into documents where Kubernetes' readers do
// (a line starting with "---" and holding nothing else but blanks or a comment), and prints one
// line per document: {"doc": <the document as JSON>} with what sigs.k8s.io/yaml's YAMLToJSONStrict
// (the pinned Kubernetes' YAML reading) makes of it, or {"error": "<why it refused it>"}.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"sigs.k8s.io/yaml"
)

type result struct {
	Doc   json.RawMessage `json:"doc,omitempty"`
	Error string          `json:"error,omitempty"`
}

func main() {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "yamljson:", err)
		os.Exit(1)
	}
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for _, doc := range documents(in) {
		var r result
		if j, err := yaml.YAMLToJSONStrict(doc); err != nil {
			r.Error = err.Error()
		} else {
			r.Doc = j
		}
		if err := enc.Encode(r); err != nil {
			fmt.Fprintln(os.Stderr, "yamljson:", err)
			os.Exit(1)
		}
	}
	if err := out.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "yamljson:", err)
		os.Exit(1)
	}
}

// documents cuts a stream at its separator lines; a piece with nothing in it is skipped, as the
// readers of k8s.io/apimachinery do.
func documents(stream []byte) [][]byte {
	var docs [][]byte
	var cur []byte
	for _, line := range bytes.SplitAfter(stream, []byte("\n")) {
		if separator(line) {
			if len(cur) > 0 {
				docs = append(docs, cur)
			}
			cur = nil
			continue
		}
		cur = append(cur, line...)
	}
	if len(bytes.TrimSpace(cur)) > 0 {
		docs = append(docs, cur)
	}
	return docs
}

func separator(line []byte) bool {
	if !bytes.HasPrefix(line, []byte("---")) {
		return false
	}
	rest := bytes.TrimSpace(line[3:])
	return len(rest) == 0 || rest[0] == '#'
}
