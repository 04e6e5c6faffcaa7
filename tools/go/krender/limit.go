package main

// -limit-data [-exec]: the agent's launcher for a render tool with a memory limit (agent/render/tools.py).
// Setting the limit in the child between fork and exec needs a Python callback, and CPython then
// forks (copying the page tables of the whole agent: ~18 ms for 330 MB) instead of vfork; this
// program is started with vfork, sets RLIMIT_DATA on itself and becomes the tool, so the tool
// runs under the limit from its first instruction. krender's own runs set the limit on themselves
// (before reading anything), which spares a second start.

import (
	"fmt"
	"os"
	"syscall"
)

// limit sets RLIMIT_DATA to bytes; non-zero (an exit code) on failure.
func limit(bytes uint64) int {
	if err := syscall.Setrlimit(syscall.RLIMIT_DATA, &syscall.Rlimit{Cur: bytes, Max: bytes}); err != nil {
		fmt.Fprintln(os.Stderr, "krender: setting the memory limit:", err)
		return 126
	}
	return 0
}

// execArgs executes argv; it returns only on failure.
func execArgs(argv []string) int {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "usage: krender -limit-data BYTES -exec -- PROGRAM [ARG]...")
		return 2
	}
	err := syscall.Exec(argv[0], argv, os.Environ())
	fmt.Fprintf(os.Stderr, "krender: %s: %v\n", argv[0], err)
	return 127
}
