package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuClock reads the CPU time (user + system) a system's servers have
// used so far: the workload reports what they use during its timed
// window, since on a machine of few cores the servers' CPU is taken from
// the workers'.
type cpuClock func() (time.Duration, error)

// selfCPU is this process's CPU time: the embedded NATS servers run in it
// (the bench's own work during the window is reading the workers' pipes).
func selfCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// processCPU is the CPU time of another process (redis-server) and this
// one's, from /proc (Linux).
func processCPU(pid int) cpuClock {
	return func() (time.Duration, error) {
		self, err := selfCPU()
		if err != nil {
			return 0, err
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, err
		}
		// pid (comm) state ppid ... utime stime: the comm may hold spaces
		// and parentheses, so count from the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		if i < 0 || len(f) < 13 {
			return 0, fmt.Errorf("cpu: /proc/%d/stat: %q", pid, b)
		}
		utime, err1 := strconv.ParseUint(f[11], 10, 64)
		stime, err2 := strconv.ParseUint(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			return 0, fmt.Errorf("cpu: /proc/%d/stat: %q", pid, b)
		}
		return self + time.Duration(utime+stime)*time.Second/clockTicks, nil
	}
}
