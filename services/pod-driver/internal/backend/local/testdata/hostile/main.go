// Command hostile is a test kernel that attacks its sandbox from inside a
// session (issue 18). HOSTILE_MODE picks the attack:
//
//   - probe: try to read the runner's data dir (HOSTILE_SECRET) and another
//     session's file (HOSTILE_OTHER_FILE), write outside its directories,
//     list and signal other processes (HOSTILE_OTHER_PID), undo the
//     sandbox's mounts; print one "CHECK <name> blocked|ESCAPED <detail>"
//     line per attempt and a "CONTROL" line per thing it must be able to
//     do, then "HOSTILE DONE".
//   - alloc: touch HOSTILE_ALLOC_MB MiB, printing progress; "ALLOC SURVIVED"
//     if it was never stopped.
//   - sleep: print "HOSTILE SLEEPING" and never end on its own.
//
// Its arguments (run <entry>) are ignored.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	switch os.Getenv("HOSTILE_MODE") {
	case "probe":
		probe()
	case "alloc":
		alloc()
	case "sleep":
		fmt.Println("HOSTILE SLEEPING")
		for {
			time.Sleep(time.Hour)
		}
	default:
		fmt.Println("hostile: unknown HOSTILE_MODE")
		os.Exit(2)
	}
}

func check(name string, err error, detail string) {
	if err != nil {
		fmt.Printf("CHECK %s blocked %v\n", name, err)
		return
	}
	fmt.Printf("CHECK %s ESCAPED %s\n", name, detail)
}

func control(name string, err error) {
	if err != nil {
		fmt.Printf("CONTROL %s FAILED %v\n", name, err)
		return
	}
	fmt.Printf("CONTROL %s ok\n", name)
}

func probe() {
	secret := os.Getenv("HOSTILE_SECRET")
	other := os.Getenv("HOSTILE_OTHER_FILE")

	_, err := os.ReadFile(secret)
	check("read_data_dir", err, secret)
	entries, err := os.ReadDir(filepath.Dir(secret))
	if err == nil && len(entries) > 0 {
		err = nil
	} else if err == nil {
		err = fmt.Errorf("empty")
	}
	check("list_data_dir", err, fmt.Sprint(len(entries), " entries"))
	_, err = os.ReadFile(other)
	check("read_other_session", err, other)
	check("write_other_session", os.WriteFile(other, []byte("overwritten"), 0o644), other)
	for _, p := range []string{"/hostile", "/usr/hostile", "/etc/hostile", filepath.Join(filepath.Dir(secret), "hostile")} {
		check("write "+p, os.WriteFile(p, []byte("x"), 0o644), p)
	}
	cwd, _ := os.Getwd()
	check("write_session_root", os.WriteFile(filepath.Join(cwd, "hostile"), []byte("x"), 0o644), cwd)
	check("remove_pid_file", os.Remove(filepath.Join(cwd, "pid")), cwd)
	check("unmount_data_dir_cover", syscall.Unmount(filepath.Dir(secret), syscall.MNT_DETACH), "unmounted")
	check("remount_root_rw", syscall.Mount("", "/", "", syscall.MS_REMOUNT|syscall.MS_BIND, ""), "remounted")

	pids := visiblePIDs()
	var err2 error
	if len(pids) > 3 {
		err2 = nil
	} else {
		err2 = fmt.Errorf("only %v visible", pids)
	}
	check("list_processes", err2, fmt.Sprint(pids))
	if pid, err := strconv.Atoi(os.Getenv("HOSTILE_OTHER_PID")); err == nil {
		check("signal_other_session", syscall.Kill(pid, syscall.SIGKILL), strconv.Itoa(pid))
		check("signal_other_group", syscall.Kill(-pid, syscall.SIGKILL), strconv.Itoa(pid))
	}
	// Everything this process may signal: inside its namespace only.
	_ = syscall.Kill(-1, syscall.SIGKILL)

	home := os.Getenv("HOME")
	control("write_home", os.WriteFile(filepath.Join(home, "ok"), []byte("ok"), 0o644))
	control("write_tmp", os.WriteFile("/tmp/ok", []byte("ok"), 0o644))
	_, err = os.ReadFile("/etc/hostname")
	control("read_host_root", err)
	fmt.Printf("ID uid=%d gid=%d pid=%d\n", os.Getuid(), os.Getgid(), os.Getpid())
	fmt.Println("HOSTILE DONE")
}

func visiblePIDs() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

func alloc() {
	mb, _ := strconv.Atoi(os.Getenv("HOSTILE_ALLOC_MB"))
	var keep [][]byte
	for i := 1; i <= mb; i++ {
		b := make([]byte, 1<<20)
		for j := range b {
			b[j] = byte(j)
		}
		keep = append(keep, b)
		if i%16 == 0 {
			fmt.Printf("ALLOC %d MiB\n", i)
		}
	}
	fmt.Println("ALLOC SURVIVED", len(keep), strings.Repeat("", 0))
}
