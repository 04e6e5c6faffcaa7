// Command fluxssa is the Flux-engine peer of benchmarks 1-3 (benchmarks/bench_kube.py): it applies
// a directory of YAML the way kustomize-controller reconciles a Kustomization, through Flux's own
// server-side apply engine, github.com/fluxcd/pkg/ssa (pinned in go.mod; benchmarks/README.md says
// which kustomize-controller release runs the same engine code).
//
// One reconcile, as the controller's: decode every document to unstructured, label it with the
// Kustomization's owner labels, normalise, ResourceManager.ApplyAllStaged with the controller's
// ApplyOptions (a GET and a server-side dry-run per object, an apply of what drifted, the
// cluster definitions first and waited for), then garbage collection: the objects of the previous
// inventory that are not in this change set are deleted with ResourceManager.DeleteAll and the
// controller's DeleteOptions. The controller keeps the inventory in the Kustomization's status;
// here it is a JSON file of the same entries ({"id": "<ns>_<name>_<group>_<kind>", "v": version}).
//
// Usage:
//
//	fluxssa apply --kubeconfig FILE --inventory FILE DIR   one reconcile; its JSON summary on stdout
//	fluxssa serve --kubeconfig FILE --inventory FILE       a long-lived engine, as the controller is:
//	    reads "apply DIR" or "warm DIR" lines on stdin and answers one JSON line each on stdout
//
// "warm DIR" resolves the REST mappings of DIR's kinds that the server already serves (what a
// running controller's mapper holds) and sends nothing else. A summary is
// {"objects", "created", "configured", "unchanged", "skipped", "applied", "deleted", "seconds"}
// or {"error": "..."}; logs go to stderr.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/fluxcd/cli-utils/pkg/kstatus/polling"
	"github.com/fluxcd/cli-utils/pkg/kstatus/polling/clusterreader"
	"github.com/fluxcd/cli-utils/pkg/kstatus/polling/engine"
	"github.com/fluxcd/cli-utils/pkg/object"
	"github.com/fluxcd/pkg/ssa"
	"github.com/fluxcd/pkg/ssa/normalize"
	ssautils "github.com/fluxcd/pkg/ssa/utils"
)

const (
	// kustomize-controller's field manager (its controllerName) and API group (the owner labels').
	controllerName = "kustomize-controller"
	ownerGroup     = "kustomize.toolkit.fluxcd.io"
)

type options struct {
	kubeconfig  string
	inventory   string
	name        string
	namespace   string
	concurrency int
	timeout     time.Duration
}

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "apply" && os.Args[1] != "serve") {
		fail("usage: fluxssa apply|serve --kubeconfig FILE --inventory FILE [DIR]")
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet("fluxssa "+mode, flag.ExitOnError)
	var o options
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster to apply to (required)")
	fs.StringVar(&o.inventory, "inventory", "", "inventory file, read before and written after each reconcile (required)")
	fs.StringVar(&o.name, "name", "bench", "the Kustomization's name, for the owner labels")
	fs.StringVar(&o.namespace, "namespace", "flux-system", "the Kustomization's namespace, for the owner labels")
	// kustomize-controller's --concurrent-ssa default.
	fs.IntVar(&o.concurrency, "concurrency", 4, "concurrent GET + dry-run per object (the controller's --concurrent-ssa)")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "deadline of one reconcile")
	_ = fs.Parse(os.Args[2:])
	if o.kubeconfig == "" || o.inventory == "" {
		fail("fluxssa %s: --kubeconfig and --inventory are required", mode)
	}
	e, err := newEngine(o)
	if err != nil {
		fail("fluxssa: %v", err)
	}
	if mode == "apply" {
		if fs.NArg() != 1 {
			fail("fluxssa apply: one directory expected, got %d arguments", fs.NArg())
		}
		s, err := e.reconcile(fs.Arg(0))
		if err != nil {
			fail("fluxssa apply %s: %v", fs.Arg(0), err)
		}
		emit(s)
		return
	}
	serve(e)
}

// serve answers one JSON line per command line until stdin closes: a warm engine, as the
// controller's (its REST mapper and HTTP connections kept between reconciles).
func serve(e *fluxEngine) {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		verb, dir, _ := strings.Cut(strings.TrimSpace(in.Text()), " ")
		switch verb {
		case "":
			continue
		case "apply":
			s, err := e.reconcile(dir)
			if err != nil {
				emit(map[string]string{"error": fmt.Sprintf("apply %s: %v", dir, err)})
				continue
			}
			emit(s)
		case "warm":
			n, err := e.warm(dir)
			if err != nil {
				emit(map[string]string{"error": fmt.Sprintf("warm %s: %v", dir, err)})
				continue
			}
			emit(map[string]int{"mapped": n})
		default:
			emit(map[string]string{"error": fmt.Sprintf("unknown command %q (apply DIR, warm DIR)", verb)})
		}
	}
	if err := in.Err(); err != nil {
		fail("fluxssa serve: reading stdin: %v", err)
	}
}

type fluxEngine struct {
	opts options
	// mapFn resolves one kind through the engine's REST mapper (the "warm" command).
	mapFn   func(gk schema.GroupKind, version string) error
	manager *ssa.ResourceManager
}

func newEngine(o options) (*fluxEngine, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", o.kubeconfig, err)
	}
	// What fluxcd/pkg/runtime/client.GetConfigOrDie does when the API server has API Priority and
	// Fairness (every supported Kubernetes): no client-side rate limit.
	cfg.QPS, cfg.Burst = -1, -1
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, httpClient)
	if err != nil {
		return nil, err
	}
	// Uncached, as the controller's reads of unstructured objects are.
	c, err := client.New(cfg, client.Options{HTTPClient: httpClient, Mapper: mapper})
	if err != nil {
		return nil, err
	}
	// The controller's status poller with its default DisableStatusPollerCache=true: direct reads.
	poller := polling.NewStatusPoller(c, mapper, polling.Options{
		ClusterReaderFactory: engine.ClusterReaderFactoryFunc(clusterreader.NewDirectClusterReader),
	})
	manager := ssa.NewResourceManager(c, poller, ssa.Owner{Field: controllerName, Group: ownerGroup})
	manager.SetConcurrency(o.concurrency)
	return &fluxEngine{
		opts: o,
		mapFn: func(gk schema.GroupKind, version string) error {
			_, err := mapper.RESTMapping(gk, version)
			return err
		},
		manager: manager,
	}, nil
}

// summary is one reconcile's outcome: the change set's actions counted, and its wall time.
type summary struct {
	Objects    int     `json:"objects"`
	Created    int     `json:"created"`
	Configured int     `json:"configured"`
	Unchanged  int     `json:"unchanged"`
	Skipped    int     `json:"skipped"`
	Applied    int     `json:"applied"`
	Deleted    int     `json:"deleted"`
	Seconds    float64 `json:"seconds"`
}

// reconcile is kustomize-controller's reconcile of one revision, from its build output on.
func (e *fluxEngine) reconcile(dir string) (*summary, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.timeout)
	defer cancel()
	old, err := readInventory(e.opts.inventory)
	if err != nil {
		return nil, err
	}
	objects, err := readObjects(dir)
	if err != nil {
		return nil, err
	}
	e.manager.SetOwnerLabels(objects, e.opts.name, e.opts.namespace)
	if err := normalize.UnstructuredList(objects); err != nil {
		return nil, err
	}
	s := &summary{Objects: len(objects)}
	applied := ssa.NewChangeSet()
	if len(objects) > 0 {
		cs, err := e.manager.ApplyAllStaged(ctx, objects, applyOptions())
		if err != nil {
			// The controller keeps the previous inventory when an apply fails.
			return nil, err
		}
		applied = cs
	}
	next := inventoryOf(applied)
	stale, err := staleObjects(old, next)
	if err != nil {
		return nil, err
	}
	var pruneErr error
	if len(stale) > 0 {
		deleted, err := e.manager.DeleteAll(ctx, stale, e.deleteOptions())
		if err != nil {
			// As the controller does: objects whose DELETE was not confirmed stay in the inventory,
			// so the next reconcile tries again.
			next = merge(next, survivors(stale, deleted))
			pruneErr = err
		}
		for _, d := range deleted.Entries {
			if d.Action == ssa.DeletedAction {
				s.Deleted++
			}
		}
	}
	if err := writeInventory(e.opts.inventory, next); err != nil {
		return nil, err
	}
	if pruneErr != nil {
		return nil, pruneErr
	}
	for _, c := range applied.Entries {
		switch c.Action {
		case ssa.CreatedAction:
			s.Created++
		case ssa.ConfiguredAction:
			s.Configured++
		case ssa.UnchangedAction:
			s.Unchanged++
		case ssa.SkippedAction:
			s.Skipped++
		}
	}
	s.Applied = s.Created + s.Configured
	s.Seconds = time.Since(start).Seconds()
	return s, nil
}

// warm resolves the mappings of the directory's kinds, ignoring kinds the server does not serve
// yet (a CRD in the directory that is still to be created).
func (e *fluxEngine) warm(dir string) (int, error) {
	objects, err := readObjects(dir)
	if err != nil {
		return 0, err
	}
	seen := map[schema.GroupVersionKind]bool{}
	mapped := 0
	for _, o := range objects {
		gvk := o.GroupVersionKind()
		if seen[gvk] {
			continue
		}
		seen[gvk] = true
		if e.mapFn(gvk.GroupKind(), gvk.Version) == nil {
			mapped++
		}
	}
	return mapped, nil
}

// applyOptions are kustomize-controller's for a Kustomization without force, ignore rules,
// custom stages or disallowed field managers, and with its feature gates at their defaults.
func applyOptions() ssa.ApplyOptions {
	o := ssa.DefaultApplyOptions()
	o.Force = false
	o.ExclusionSelector = map[string]string{ownerGroup + "/reconcile": "disabled", ownerGroup + "/ssa": "Ignore"}
	o.IfNotPresentSelector = map[string]string{ownerGroup + "/ssa": "IfNotPresent"}
	o.ForceSelector = map[string]string{ownerGroup + "/force": "enabled"}
	o.Cleanup = ssa.ApplyCleanupOptions{
		Annotations: []string{
			corev1.LastAppliedConfigAnnotation,
			ownerGroup + "/checksum",
			"fluxcd.io/sync-checksum",
		},
		Labels: []string{"fluxcd.io/sync-gc-mark"},
		FieldManagers: []ssa.FieldManager{
			{Name: "kubectl", OperationType: metav1.ManagedFieldsOperationApply},
			{Name: "kubectl", OperationType: metav1.ManagedFieldsOperationUpdate},
			{Name: "before-first-apply", OperationType: metav1.ManagedFieldsOperationUpdate},
			{Name: controllerName, OperationType: metav1.ManagedFieldsOperationUpdate},
		},
		Exclusions: map[string]string{ownerGroup + "/ssa": "Merge"},
	}
	return o
}

// deleteOptions are the controller's garbage collection's: background propagation, only objects
// carrying this Kustomization's owner labels, none opted out by annotation or label.
func (e *fluxEngine) deleteOptions() ssa.DeleteOptions {
	o := ssa.DefaultDeleteOptions()
	o.Inclusions = e.manager.GetOwnerLabels(e.opts.name, e.opts.namespace)
	o.Exclusions = map[string]string{
		ownerGroup + "/prune":     "disabled",
		ownerGroup + "/reconcile": "disabled",
		ownerGroup + "/ssa":       "Ignore",
	}
	return o
}

// readObjects decodes every YAML (or JSON) file of dir, in name order, as the controller decodes
// its build output (ssa/utils.ReadObjects).
func readObjects(dir string) ([]*unstructured.Unstructured, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var objects []*unstructured.Unstructured
	for _, entry := range entries {
		ext := filepath.Ext(entry.Name())
		if entry.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			continue
		}
		path := filepath.Join(dir, entry.Name())
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		objs, err := ssautils.ReadObjects(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		objects = append(objects, objs...)
	}
	return objects, nil
}

// entry is one inventory record, as in a Kustomization's status.inventory.entries.
type entry struct {
	ID      string `json:"id"`
	Version string `json:"v"`
}

type inventory struct {
	Entries []entry `json:"entries"`
}

func readInventory(path string) (inventory, error) {
	var inv inventory
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return inv, nil
	}
	if err != nil {
		return inv, err
	}
	if err := json.Unmarshal(data, &inv); err != nil {
		return inv, fmt.Errorf("inventory %s: %w", path, err)
	}
	return inv, nil
}

// writeInventory replaces the file in one rename, so a crash leaves the old or the new inventory.
func writeInventory(path string, inv inventory) error {
	data, err := json.Marshal(inv)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// inventoryOf records every entry of the change set, unchanged and skipped objects included.
func inventoryOf(cs *ssa.ChangeSet) inventory {
	inv := inventory{Entries: make([]entry, 0, len(cs.Entries))}
	for _, c := range cs.Entries {
		inv.Entries = append(inv.Entries, entry{ID: c.ObjMetadata.String(), Version: c.GroupVersion})
	}
	return inv
}

// staleObjects are the entries of old missing from next, as objects DeleteAll can address.
func staleObjects(old, next inventory) ([]*unstructured.Unstructured, error) {
	keep := make(map[string]bool, len(next.Entries))
	for _, e := range next.Entries {
		keep[e.ID] = true
	}
	var stale []*unstructured.Unstructured
	for _, e := range old.Entries {
		if keep[e.ID] {
			continue
		}
		m, err := object.ParseObjMetadata(e.ID)
		if err != nil {
			return nil, fmt.Errorf("inventory entry %q: %w", e.ID, err)
		}
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(m.GroupKind.WithVersion(e.Version))
		u.SetName(m.Name)
		u.SetNamespace(m.Namespace)
		stale = append(stale, u)
	}
	sort.Sort(ssa.SortableUnstructureds(stale))
	return stale, nil
}

// survivors are the stale objects whose deletion was neither confirmed nor skipped on purpose.
func survivors(stale []*unstructured.Unstructured, cs *ssa.ChangeSet) []*unstructured.Unstructured {
	settled := map[string]bool{}
	if cs != nil {
		for _, c := range cs.Entries {
			if c.Action == ssa.DeletedAction || c.Action == ssa.SkippedAction {
				settled[c.ObjMetadata.String()] = true
			}
		}
	}
	var out []*unstructured.Unstructured
	for _, u := range stale {
		if !settled[object.UnstructuredToObjMetadata(u).String()] {
			out = append(out, u)
		}
	}
	return out
}

func merge(inv inventory, objects []*unstructured.Unstructured) inventory {
	seen := make(map[string]bool, len(inv.Entries))
	for _, e := range inv.Entries {
		seen[e.ID] = true
	}
	for _, u := range objects {
		id := object.UnstructuredToObjMetadata(u).String()
		if !seen[id] {
			inv.Entries = append(inv.Entries, entry{ID: id, Version: u.GroupVersionKind().Version})
			seen[id] = true
		}
	}
	return inv
}

func emit(v any) {
	data, err := json.Marshal(v)
	if err != nil {
		fail("fluxssa: %v", err)
	}
	fmt.Println(string(data))
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}
