package main

// A YAML stream read as Kubernetes reads it (go-yaml v2, as sigs.k8s.io/yaml's YAMLToJSONStrict)
// and printed as JSON, so that the agent reads tool output with json.loads instead of parsing
// YAML in Python (agent/render/gojson.py). Only ordinary streams are converted: anything the
// agent's own reader treats specially (tags, anchors, aliases, merge keys, keys that are not
// strings, duplicate keys, deep nesting, document markers with content, unusual line breaks) or
// go-yaml refuses is handed over, and the agent parses the YAML itself: it stays the reference
// for every value, message and line.
//
// The JSON is an array with one [line, value] pair per document of the stream, counted as libyaml
// counts them (every "---" starts one, a leading piece counts when it holds content; an empty
// document is null), line being the 1-based line where the document's root node starts. Keys keep
// their order in the YAML.

import (
	"bytes"
	"encoding/json"
	"errors"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	yaml "go.yaml.in/yaml/v2"
	yaml3 "go.yaml.in/yaml/v3"
)

// maxDepth is the deepest nesting converted; deeper documents are the agent's to bound and report.
const maxDepth = 100

// noGCBytes is the largest stream converted without a garbage collection: it then takes ~14
// bytes of memory for each byte of YAML (110 MB at most, a fifth of the default render_memory).
const noGCBytes = 8 << 20

var errHandover = errors.New("the agent reads this stream itself")

// piece is one document of a stream: its body and the line its root node starts on (0: empty).
type piece struct {
	line int
	body []byte
}

// toJSON is the stream as JSON documents, or errHandover.
func toJSON(stream []byte) ([]byte, error) { return convertStream(stream, false) }

// convertStream is toJSON, handing over a stream with a List where lists is set.
func convertStream(stream []byte, lists bool) ([]byte, error) {
	if unusual(stream) {
		return nil, errHandover
	}
	pieces, ok := split(stream)
	if !ok {
		return nil, errHandover
	}
	if len(stream) <= noGCBytes {
		// The collector competed with the conversion for the two cores it had (a third of its
		// time); what a stream this size leaves behind fits any render's memory.
		defer debug.SetGCPercent(debug.SetGCPercent(-1))
	}
	out := make([][]byte, len(pieces))
	errs := make([]error, len(pieces))
	work := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				out[i], errs[i] = document(pieces[i], lists)
			}
		}()
	}
	// Largest first, so that the last one to finish starts early (a chart's few large CRDs).
	order := make([]int, len(pieces))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return len(pieces[order[a]].body) > len(pieces[order[b]].body) })
	for _, i := range order {
		work <- i
	}
	close(work)
	wg.Wait()
	size := 2
	for i, e := range errs {
		if e != nil {
			return nil, errHandover
		}
		size += len(out[i]) + 1
	}
	buf := make([]byte, 0, size)
	buf = append(buf, '[')
	for i, d := range out {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, d...)
	}
	return append(buf, ']', '\n'), nil
}

// unusual reports what makes line numbers or documents differ between readers: line breaks other
// than "\n", a byte order mark, directives, text that is not UTF-8.
func unusual(s []byte) bool {
	for _, b := range [][]byte{[]byte("\r"), []byte("\u0085"), []byte("\u2028"), []byte("\u2029"), []byte("\ufeff")} {
		if bytes.Contains(s, b) {
			return true
		}
	}
	return !utf8.Valid(s) || bytes.HasPrefix(s, []byte("%")) || bytes.Contains(s, []byte("\n%"))
}

// suspect reports whether a document may hold a tag, a merge key, or an anchor and an alias: a
// "!", "&" or "*" where a node may start (after a line's indentation or an indicator), or "<<:".
// Text in multi-line scalars looks the same ("* item" in a CRD's description, "!has(x)" in an
// expression), so a suspect document is looked at closely (tagged) rather than handed over.
func suspect(s []byte) bool {
	var anchor, alias bool
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '!', '&', '*':
			j := i - 1
			for j >= 0 && (s[j] == ' ' || s[j] == '\t') {
				j--
			}
			if j >= 0 && bytes.IndexByte([]byte("\n:?-[{,"), s[j]) < 0 {
				continue
			}
			switch s[i] {
			case '!':
				return true
			case '&':
				anchor = true
			default:
				alias = true
			}
		case '<':
			if i+1 < len(s) && s[i+1] == '<' {
				j := i + 2
				for j < len(s) && (s[j] == ' ' || s[j] == '\t') {
					j++
				}
				if j < len(s) && s[j] == ':' {
					return true
				}
			}
		}
	}
	// An alias needs its anchor (go-yaml refuses it otherwise), and an anchor alone changes no value.
	return anchor && alias
}

// tagged reports whether the document has a node written with a tag, an anchor, an alias or a
// merge key, or does not parse.
func tagged(doc []byte) bool {
	var root yaml3.Node
	if err := yaml3.Unmarshal(doc, &root); err != nil {
		return true
	}
	var walk func(n *yaml3.Node) bool
	walk = func(n *yaml3.Node) bool {
		if n.Style&yaml3.TaggedStyle != 0 || n.Anchor != "" || n.Kind == yaml3.AliasNode || n.Tag == "!!merge" {
			return true
		}
		for _, c := range n.Content {
			if walk(c) {
				return true
			}
		}
		return false
	}
	return walk(&root)
}

// split cuts the stream into documents where libyaml does; false for a document marker it does
// not simply cut at ("--- value", "...").
func split(s []byte) ([]piece, bool) {
	var pieces []piece
	cur, explicit, start := piece{}, false, 0
	for off, n := 0, 1; off < len(s); n++ {
		next := len(s)
		if end := bytes.IndexByte(s[off:], '\n'); end >= 0 {
			next = off + end + 1
		}
		line := s[off:next]
		switch {
		case marker(line, "---"):
			if rest := bytes.TrimLeft(line[3:], " \t\n"); len(rest) > 0 && rest[0] != '#' {
				return nil, false
			}
			if explicit || cur.line > 0 {
				cur.body = s[start:off]
				pieces = append(pieces, cur)
			}
			cur, explicit, start = piece{}, true, next
		case marker(line, "..."):
			return nil, false
		case cur.line == 0:
			if rest := bytes.TrimLeft(line, " \t\n"); len(rest) > 0 && rest[0] != '#' {
				cur.line = n
			}
		}
		off = next
	}
	if explicit || cur.line > 0 {
		cur.body = s[start:]
		pieces = append(pieces, cur)
	}
	return pieces, true
}

func marker(line []byte, m string) bool {
	return bytes.HasPrefix(line, []byte(m)) && (len(line) == 3 || bytes.IndexByte([]byte(" \t\n"), line[3]) >= 0)
}

// document is one [line, value] pair; the root must be a non-empty mapping (and no List, with
// lists: the agent keeps the lines of its items).
func document(p piece, lists bool) ([]byte, error) {
	buf := []byte{'['}
	buf = strconv.AppendInt(buf, int64(p.line), 10)
	buf = append(buf, ',')
	if p.line == 0 {
		return append(buf, "null]"...), nil
	}
	if suspect(p.body) && tagged(p.body) {
		return nil, errHandover
	}
	var root yaml.MapSlice
	if err := yaml.Unmarshal(p.body, &root); err != nil || len(root) == 0 {
		return nil, errHandover // a syntax error, or a root that is no mapping (or an empty one)
	}
	if lists && isList(root) {
		return nil, errHandover
	}
	buf, err := value(buf, root, 1)
	if err != nil {
		return nil, err
	}
	return append(buf, ']'), nil
}

// isList reports a kind ending in "List" with items, as the agent tells a List (tooljson._is_list).
func isList(root yaml.MapSlice) bool {
	var kind string
	var items bool
	for _, item := range root {
		switch item.Key {
		case "kind":
			kind, _ = item.Value.(string)
		case "items":
			items = true
		}
	}
	return items && strings.HasSuffix(kind, "List")
}

// value appends v as JSON, as encoding/json writes what go-yaml decoded.
func value(buf []byte, v interface{}, depth int) ([]byte, error) {
	if depth > maxDepth {
		return nil, errHandover
	}
	var err error
	switch t := v.(type) {
	case nil:
		return append(buf, "null"...), nil
	case bool:
		return strconv.AppendBool(buf, t), nil
	case string:
		return appendString(buf, t), nil
	case int:
		return strconv.AppendInt(buf, int64(t), 10), nil
	case int64:
		return strconv.AppendInt(buf, t, 10), nil
	case uint64:
		return strconv.AppendUint(buf, t, 10), nil
	case float64:
		j, err := json.Marshal(t) // its number format, which the agent reads back as Kubernetes does
		if err != nil {
			return nil, errHandover // .nan, .inf
		}
		return append(buf, j...), nil
	case yaml.MapSlice:
		buf = append(buf, '{')
		seen := make(map[string]struct{}, len(t))
		for i, item := range t {
			key, ok := item.Key.(string)
			if !ok {
				return nil, errHandover // 80:, true:, ~: the agent reads (or refuses) them itself
			}
			if _, dup := seen[key]; dup {
				return nil, errHandover
			}
			seen[key] = struct{}{}
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = append(appendString(buf, key), ':')
			if buf, err = value(buf, item.Value, depth+1); err != nil {
				return nil, err
			}
		}
		return append(buf, '}'), nil
	case []interface{}:
		buf = append(buf, '[')
		for i, item := range t {
			if i > 0 {
				buf = append(buf, ',')
			}
			if buf, err = value(buf, item, depth+1); err != nil {
				return nil, err
			}
		}
		return append(buf, ']'), nil
	}
	return nil, errHandover // anything else go-yaml may make (a time, bytes) is the agent's to judge
}

const hex = "0123456789abcdef"

// appendString appends s (valid UTF-8) as a JSON string.
func appendString(buf []byte, s string) []byte {
	buf = append(buf, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		buf = append(buf, s[start:i]...)
		switch c {
		case '"', '\\':
			buf = append(buf, '\\', c)
		case '\n':
			buf = append(buf, '\\', 'n')
		case '\t':
			buf = append(buf, '\\', 't')
		default:
			buf = append(buf, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	buf = append(buf, s[start:]...)
	return append(buf, '"')
}
