// Command krender is gitops-agent's kustomize build (agent/render/kustomize.py runs it): the
// pinned sigs.k8s.io/kustomize/api over an in-memory view of one checkout, with an HTTP
// transport that refuses every request and no program on PATH, so a kustomization reads
// nothing but the checkout's files it was given and reaches no network, whichever field a
// kustomize release adds.
//
// Usage: krender -root CHECKOUT [-max-input BYTES] [-max-file BYTES] [-json [-yaml-if TEXT]] [-dir D]... [-file F]... DIR
//
//	krender -convert < STREAM
//	krender -helm-output [-max-input BYTES] [-yaml-if-list] < HELM-TEMPLATE-OUTPUT
//
// Each -dir (the kustomization directories, with the files directly in them) and -file (the
// other files the kustomizations name) is mounted in memory at its own absolute path, as
// kustomize names it (so its messages name the same files as `kustomize build` would); a
// symlink is followed only to a target inside the checkout. Nothing else exists for the build.
// Standard output is exactly what `kustomize build DIR` prints; errors go to standard error
// with exit code 1 (2 for a usage error).
//
// With -json, standard output is the build as JSON documents (tojson.go) instead, unless the
// stream is not an ordinary one, or (-yaml-if) a value holds TEXT: then it is the YAML, which
// never starts with "[" as the JSON does. -convert reads a YAML stream (helm template's output)
// on standard input and prints it as JSON documents, or nothing with exit code 3 where -json
// would print the YAML. -helm-output does the same for the agent's pipe from helm, with helm's
// "# Source:" comments (helmoutput.go).
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// errNoNetwork is what every HTTP request made during a render gets.
var errNoNetwork = errors.New("network access is refused during a render")

type refuse struct{}

func (refuse) RoundTrip(r *http.Request) (*http.Response, error) {
	return nil, fmt.Errorf("%s %s: %w", r.Method, r.URL.Redacted(), errNoNetwork)
}

type paths []string

func (p *paths) String() string     { return strings.Join(*p, ",") }
func (p *paths) Set(v string) error { *p = append(*p, v); return nil }

func main() {
	var dirs, files paths
	flag.Var(&dirs, "dir", "a directory whose files (not sub-directories) the build may read")
	flag.Var(&files, "file", "a file the build may read")
	root := flag.String("root", "", "the checkout: no file outside it is ever read")
	maxInput := flag.Int64("max-input", 64<<20, "largest total of checkout bytes (or of helm's output) read into memory")
	maxFile := flag.Int64("max-file", 16<<20, "largest single file of the checkout")
	asJSON := flag.Bool("json", false, "print JSON documents where the output is an ordinary stream")
	yamlIf := flag.String("yaml-if", "", "with -json: print YAML where a value holds this text")
	convert := flag.Bool("convert", false, "print the YAML stream on standard input as JSON documents")
	helm := flag.Bool("helm-output", false, "print helm template's output on standard input for the agent")
	yamlIfList := flag.Bool("yaml-if-list", false, "with -helm-output: print the YAML where a document is a List")
	flag.Parse()
	if *helm {
		os.Exit(helmOutput(*maxInput, *yamlIfList))
	}
	if *convert {
		os.Exit(convertStdin())
	}
	if *root == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: krender -root CHECKOUT [-max-input BYTES] [-max-file BYTES] DIR")
		os.Exit(2)
	}
	// No program to run (kustomize clones remote bases with git) and no network.
	os.Setenv("PATH", "")
	http.DefaultTransport = refuse{}
	http.DefaultClient = &http.Client{Transport: refuse{}}

	out, err := build(*root, flag.Arg(0), dirs, files, *maxInput, *maxFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
	if *asJSON {
		if j, err := toJSON(out); err == nil && (*yamlIf == "" || !bytes.Contains(j, []byte(*yamlIf))) {
			out = j
		}
	}
	if _, err := os.Stdout.Write(out); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

// convertStdin is -convert: 0 when it printed JSON documents, 3 when it hands the stream over.
func convertStdin() int {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		return 1
	}
	j, err := toJSON(in)
	if err != nil {
		return 3
	}
	if _, err := os.Stdout.Write(j); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		return 1
	}
	return 0
}

func build(root, dir string, dirs, files []string, maxInput, maxFile int64) ([]byte, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	if root, err = filepath.EvalSymlinks(root); err != nil {
		return nil, err
	}
	mem := filesys.MakeFsInMemory()
	m := &mounter{root: root, mem: mem, left: maxInput, maxFile: maxFile}
	for _, d := range append([]string{dir}, dirs...) {
		if err := m.dir(filepath.Clean(d)); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		if err := m.file(filepath.Clean(f)); err != nil {
			return nil, err
		}
	}
	opts := krusty.MakeDefaultOptions()
	// As `kustomize build` without flags: the kustomization's sortOptions, else legacy order.
	opts.Reorder = krusty.ReorderOptionUnspecified
	// Memory holds only checked files of the checkout: paths anywhere in it load, nothing else exists.
	opts.LoadRestrictions = types.LoadRestrictionsNone
	opts.PluginConfig = types.DisabledPluginConfig()
	res, err := krusty.MakeKustomizer(opts).Run(mem, filepath.Clean(dir))
	if err != nil {
		return nil, err
	}
	return res.AsYaml()
}

// mounter copies files of a checkout into memory, within a byte budget.
type mounter struct {
	root    string
	mem     filesys.FileSystem
	left    int64
	maxFile int64
}

// real is the file or directory that path names, if it lies inside the checkout.
func (m *mounter) real(path string) (string, bool) {
	if !inside(path, m.root) {
		return "", false
	}
	target, err := filepath.EvalSymlinks(path)
	if err != nil || !inside(target, m.root) {
		return "", false
	}
	return target, true
}

// dir mounts the regular files directly in the directory path.
func (m *mounter) dir(path string) error {
	real, ok := m.real(path)
	if !ok {
		return fmt.Errorf("%s is not a directory inside the checkout", path)
	}
	if err := m.mem.MkdirAll(path); err != nil {
		return err
	}
	entries, err := os.ReadDir(real)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type().IsRegular() || e.Type()&fs.ModeSymlink != 0 {
			if err := m.file(filepath.Join(path, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// file mounts one file at path (a symlink to a directory, or out of the checkout, is skipped).
func (m *mounter) file(path string) error {
	real, ok := m.real(path)
	if !ok || m.mem.Exists(path) {
		return nil
	}
	info, err := os.Stat(real)
	if err != nil || !info.Mode().IsRegular() {
		return nil
	}
	shown, _ := filepath.Rel(m.root, path)
	if info.Size() > m.maxFile {
		return fmt.Errorf("%s is %d bytes, over the limit of %d for one file", shown, info.Size(), m.maxFile)
	}
	if m.left -= info.Size(); m.left < 0 {
		return fmt.Errorf("the files this kustomization reads exceed the render limit (at %s)", shown)
	}
	data, err := os.ReadFile(real)
	if err != nil {
		return err
	}
	return m.mem.WriteFile(path, data)
}

func inside(path, root string) bool {
	return path == root || strings.HasPrefix(path, root+string(filepath.Separator))
}
