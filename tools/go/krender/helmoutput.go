package main

// -helm-output: helm template's output, read on standard input as helm writes it (the agent
// pipes helm into krender, both started at once, so krender's start costs nothing), printed
// for the agent:
//   - where it converts: one JSON object, {"sources": [[line, rest of the line], ...] for every
//     "# Source:" comment (the agent has no text to find them in), "documents": the JSON
//     documents of toJSON};
//   - else (a stream the agent reads itself; with -yaml-if-list, also one with a List, whose
//     items' lines the agent keeps): the output as helm printed it, which never starts with "{";
//   - where it passes -max-input bytes: its first -max-input+1 bytes, exit 1 (the agent reads
//     that as output over its limit, as it would reading helm itself).

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
)

// sourcePrefix starts the comment helm prints before each template's output.
var sourcePrefix = []byte("# Source: ")

// helmOutput is -helm-output; it returns krender's exit code.
func helmOutput(maxOutput int64, yamlIfList bool) int {
	out, err := io.ReadAll(io.LimitReader(os.Stdin, maxOutput+1))
	if err != nil {
		fmt.Fprintln(os.Stderr, "krender: reading helm's output:", err)
		return 1
	}
	if int64(len(out)) > maxOutput {
		return write(out, 1)
	}
	return write(converted(out, maxOutput, yamlIfList), 0)
}

// converted is helm's output as one JSON object, or the output itself where the agent reads it
// or the JSON would pass maxOutput.
func converted(out []byte, maxOutput int64, yamlIfList bool) []byte {
	docs, err := convertStream(out, yamlIfList)
	if err != nil {
		return out
	}
	found, ok := sourceComments(out)
	if !ok || int64(len(docs)+len(found)+32) > maxOutput {
		return out
	}
	buf := make([]byte, 0, len(docs)+len(found)+32)
	buf = append(buf, `{"sources":`...)
	buf = append(buf, found...)
	buf = append(buf, `,"documents":`...)
	buf = append(buf, bytes.TrimRight(docs, "\n")...)
	return append(buf, '}', '\n')
}

// sourceComments is a JSON array of [line, rest of the line] for every line that starts with
// "# Source: ", lines counted at "\n"; false where the text has another character that Python's
// str.splitlines breaks lines at (the agent then counts them itself). The stream converted, so
// it holds none of those unusual() refuses.
func sourceComments(s []byte) ([]byte, bool) {
	for _, c := range []byte("\v\f\x1c\x1d\x1e") {
		if bytes.IndexByte(s, c) >= 0 {
			return nil, false
		}
	}
	buf := []byte{'['}
	for off, n := 0, 1; off < len(s); n++ {
		next := len(s)
		if end := bytes.IndexByte(s[off:], '\n'); end >= 0 {
			next = off + end + 1
		}
		if line := bytes.TrimSuffix(s[off:next], []byte("\n")); bytes.HasPrefix(line, sourcePrefix) {
			if len(buf) > 1 {
				buf = append(buf, ',')
			}
			buf = append(strconv.AppendInt(append(buf, '['), int64(n), 10), ',')
			buf = append(appendString(buf, string(line[len(sourcePrefix):])), ']')
		}
		off = next
	}
	return append(buf, ']'), true
}

// write prints data and returns code, or 1 where standard output is gone.
func write(data []byte, code int) int {
	if _, err := os.Stdout.Write(data); err != nil {
		fmt.Fprintln(os.Stderr, "krender:", err)
		return 1
	}
	return code
}
