package main

// -limit-data: the agent's launcher for a render tool with a memory limit (agent/render/tools.py).
// Setting the limit in the child between fork and exec needs a Python callback, and CPython then
// forks (copying the page tables of the whole agent: ~18 ms for 330 MB) instead of vfork; this
// program is started with vfork, sets RLIMIT_DATA on itself and becomes the tool, so the tool
// runs under the limit from its first instruction.

import (
	"fmt"
	"os"
	"syscall"
)

// limitAndExec sets RLIMIT_DATA to limit bytes and executes argv; it returns only on failure.
func limitAndExec(limit uint64, argv []string) int {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "usage: krender -limit-data BYTES -- PROGRAM [ARG]...")
		return 2
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_DATA, &syscall.Rlimit{Cur: limit, Max: limit}); err != nil {
		fmt.Fprintln(os.Stderr, "krender: setting the memory limit:", err)
		return 126
	}
	err := syscall.Exec(argv[0], argv, os.Environ())
	fmt.Fprintf(os.Stderr, "krender: %s: %v\n", argv[0], err)
	return 127
}
