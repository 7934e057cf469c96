package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// userHZ is the kernel's USER_HZ, the unit of utime and stime in
// /proc/<pid>/stat; it is 100 on every Linux architecture Go supports.
const userHZ = 100

// process is one server the harness started.
type process struct {
	name string
	addr string
	// metricsAddr is the HTTP address of the server's /metrics and, when
	// started with --pprof, /debug/pprof/ ("" when it has none).
	metricsAddr string
	cmd         *exec.Cmd
	done        chan struct{}
	logs        *lockedBuffer
	// gcCPU is the CPU time, in nanoseconds, of the garbage collections
	// the process reported on stderr so far (GODEBUG=gctrace=1; see
	// gcTraceCPU), zero for a process not started with it.
	gcCPU atomic.Int64
}

// build compiles the Go package pkg (relative to dir) into outDir/name.
// modfile, when set, builds pkg from that tools module.
func build(ctx context.Context, dir, outDir, name, pkg, modfile string) (string, error) {
	bin := filepath.Join(outDir, name)
	args := []string{"build", "-o", bin}
	if modfile != "" {
		args = append(args, "-modfile="+modfile)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, pkg)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	return bin, nil
}

// startServing runs bin with args and env and waits for the JSON
// {"msg":"serving","addr":…} line on stderr that retryd and bench/echo
// log once they listen.
func startServing(ctx context.Context, name, bin string, args, env []string) (*process, error) {
	p, lines, err := start(ctx, name, bin, args, env)
	if err != nil {
		return nil, err
	}
	timeout := time.After(30 * time.Second)
	for {
		select {
		case line := <-lines:
			var rec struct {
				Msg         string `json:"msg"`
				Addr        string `json:"addr"`
				MetricsAddr string `json:"metrics_addr"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "serving" && rec.Addr != "" {
				p.addr, p.metricsAddr = rec.Addr, rec.MetricsAddr
				return p, nil
			}
		case <-p.done:
			return nil, fmt.Errorf("%s exited before serving:\n%s", name, p.logs.String())
		case <-timeout:
			p.stop()
			return nil, fmt.Errorf("%s did not serve within 30s:\n%s", name, p.logs.String())
		}
	}
}

// start runs bin and returns its stderr lines (dropped when nobody reads).
func start(ctx context.Context, name, bin string, args, env []string) (*process, <-chan string, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stdout = nil
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{}), logs: &lockedBuffer{}}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if ns, ok := gcTraceCPU(sc.Text()); ok {
				p.gcCPU.Add(ns)
				continue // one line per collection: not worth the log tail
			}
			p.logs.add(sc.Text())
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	go func() {
		select {
		case <-ctx.Done():
			p.stop()
		case <-p.done:
		}
	}()
	return p, lines, nil
}

// stop sends SIGTERM, then SIGKILL after 10s, and waits for the exit.
func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// cpuSeconds is the process's user plus system CPU time so far, all
// threads, from /proc/<pid>/stat.
func (p *process) cpuSeconds() (float64, error) {
	return procCPU(p.cmd.Process.Pid)
}

func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("reading the CPU time of pid %d: %w", pid, err)
	}
	// The command name (field 2) may hold spaces; fields after it are
	// plain. utime and stime are fields 14 and 15.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return float64(utime+stime) / userHZ, nil
}

// schedStats sums /proc/<pid>/task/<tid>/schedstat over the process's
// threads: wait is how long they spent runnable but waiting for a CPU
// (the second field: the time the kernel gave to other processes, or to
// the process's other threads, while this one had work), and runs how
// often a thread was put on a CPU (the third field: each wake-up of a
// sleeping thread is one). Threads that have exited no longer count.
func schedStats(pid int) (wait time.Duration, runs int64, err error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, fmt.Errorf("reading the threads of pid %d: %w", pid, err)
	}
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/schedstat")
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b))
		if len(f) < 3 {
			return 0, 0, fmt.Errorf("%s/%s/schedstat: %q", dir, t.Name(), b)
		}
		ns, err1 := strconv.ParseInt(f[1], 10, 64)
		n, err2 := strconv.ParseInt(f[2], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return 0, 0, fmt.Errorf("%s/%s/schedstat: %w", dir, t.Name(), err)
		}
		wait += time.Duration(ns)
		runs += n
	}
	return wait, runs, nil
}

// scrape reads the named unlabelled samples from a server's /metrics;
// a server that has none gives none.
func scrape(ctx context.Context, p *process, names ...string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.metricsAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := make(map[string]float64, len(names))
	if resp.StatusCode != http.StatusOK {
		return out, nil // no /metrics here (ratelimit's debug listener)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || !slices.Contains(names, name) {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", name, v, err)
		}
		out[name] = f
	}
	return out, sc.Err()
}

// loadAverage is the machine's 1-minute load average (/proc/loadavg), or
// "?".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// freeLoopbackAddr reserves a loopback port by listening and closing; for
// servers (gubernator) that cannot report the port they bound.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

type lockedBuffer struct {
	mu    sync.Mutex
	lines []string
}

// add keeps the last 200 lines.
func (b *lockedBuffer) add(line string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, line)
	if len(b.lines) > 200 {
		b.lines = b.lines[len(b.lines)-200:]
	}
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines, "\n")
}

// gcTraceCPU reads the CPU time of one collection from a GODEBUG=gctrace=1
// line ("gc 7 @0.512s 1%: 0.011+1.2+0.020 ms clock, 0.045+0.31/0.58/0.10+0.082
// ms cpu, …"): the sum of the "ms cpu" terms, that is stop-the-world sweep
// termination, mark assists, background and idle marking, and mark
// termination, in nanoseconds. Sweeping is not in it.
func gcTraceCPU(line string) (int64, bool) {
	if !strings.HasPrefix(line, "gc ") {
		return 0, false
	}
	_, rest, ok := strings.Cut(line, " ms clock, ")
	if !ok {
		return 0, false
	}
	terms, _, ok := strings.Cut(rest, " ms cpu")
	if !ok {
		return 0, false
	}
	var ms float64
	for _, f := range strings.FieldsFunc(terms, func(r rune) bool { return r == '+' || r == '/' }) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return 0, false
		}
		ms += v
	}
	return int64(ms * 1e6), true
}
