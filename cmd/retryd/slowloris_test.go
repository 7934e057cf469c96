package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	retrydv1 "github.com/retryd/retryd/gen/retryd/v1"
	"github.com/retryd/retryd/internal/retrydtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// The slow-loris load: idle TCP connections and AwaitRetry streams whose
// receiving side never reads.
const (
	idleConns       = 2000 // half send nothing, half the HTTP/2 preface and then nothing
	slowSessions    = 50   // sessions with a retry pending for an hour
	awaitersPerConn = 50
	grpcAwaitConns  = 5 // 250 streams from grpc-go clients that never call Recv
	rawAwaitConns   = 5 // 250 streams from a raw HTTP/2 client with a zero window
	slowStreams     = (grpcAwaitConns + rawAwaitConns) * awaitersPerConn
	// rssBound and goroutineBound are generous bounds on the server under
	// this load (measured: about 60 MiB, or 330 MiB with -race, and 4 550
	// goroutines).
	rssBound       = 512 << 20
	goroutineBound = 12_000
)

// TestSlowLoris holds 2 000 idle connections and 500 AwaitRetry streams that
// never read open against the real binary, and checks that an ordinary
// client is still served (a failure scheduled, awaited and started within
// 10 s) and that the server's memory stays bounded. It logs the server's
// resident memory and goroutines before, during and after.
func TestSlowLoris(t *testing.T) {
	if testing.Short() {
		t.Skip("slow-loris load test: skipped with -short")
	}
	raiseFileLimit(t, 2*(idleConns+grpcAwaitConns+rawAwaitConns)+512)

	marker := "SLOWLORIS_MARKER=" + nonce(t)
	// Ten awaiters share each retry here, over the admission default of
	// eight: this test is about connections and unread streams, and
	// TestAdmissionBounds covers that bound.
	srv := retrydtest.StartWithEnv(t, []string{marker}, "--metrics-listen", "127.0.0.1:0",
		"--max-awaiters-per-retry", strconv.Itoa(slowStreams/slowSessions))
	pid := childWithEnv(t, marker)
	var attack []io.Closer
	t.Cleanup(func() { closeAll(attack) })
	conn := srv.Conn(t)
	client := retrydv1.NewRetryServiceClient(conn)

	// The retries the slow streams wait for: pending for an hour.
	hour := &retrydv1.RetryPolicy{Backoff: &retrydv1.Backoff{
		InitialDelayMs: proto.Uint64(3_600_000), MaxDelayMs: proto.Uint64(3_600_000), JitterRatio: proto.Float64(0),
	}}
	ids := make([]string, slowSessions)
	for i := range ids {
		resp, err := client.FailedStep(context.Background(), &retrydv1.FailedStepRequest{
			SessionId: fmt.Sprintf("slow-%d", i), Turn: 1, Step: 1, Provider: "p",
			Failure:      &retrydv1.Failure{Code: "SERVER"},
			PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: hour},
		})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = resp.GetDecision().GetSchedule().GetRetryId()
	}
	served(t, client, "before")
	before := measure(t, pid, srv.MetricsAddr)
	t.Logf("before: %v", before)

	// 2 000 idle connections.
	preface := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), frame(0x4, 0, 0, nil)...)
	for i := range idleConns {
		c, err := net.DialTimeout("tcp", srv.Addr, 5*time.Second)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		attack = append(attack, c)
		if i%2 == 1 {
			if _, err := c.Write(preface); err != nil {
				t.Fatalf("idle connection %d: %v", i, err)
			}
		}
	}

	// 250 AwaitRetry streams from grpc-go clients that never call Recv.
	// grpc-go ignores windows below 64 KiB; asking for exactly 64 KiB pins
	// the window there (no BDP growth).
	next := 0
	for range grpcAwaitConns {
		cc, err := grpc.NewClient(srv.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(65535), grpc.WithInitialConnWindowSize(65535))
		if err != nil {
			t.Fatal(err)
		}
		attack = append(attack, cc)
		c := retrydv1.NewRetryServiceClient(cc)
		for range awaitersPerConn {
			if _, err := c.AwaitRetry(context.Background(), &retrydv1.AwaitRetryRequest{RetryId: ids[next%slowSessions]}); err != nil {
				t.Fatal(err)
			}
			next++
		}
	}
	// 250 more from a raw HTTP/2 client that sets every stream's window to
	// zero (the server cannot send it a single byte of data) and never reads
	// its socket.
	for range rawAwaitConns {
		c, err := net.DialTimeout("tcp", srv.Addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		attack = append(attack, c)
		var b bytes.Buffer
		b.WriteString("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
		b.Write(frame(0x4, 0, 0, setting(0x4, 0))) // SETTINGS_INITIAL_WINDOW_SIZE = 0
		for i := range awaitersPerConn {
			stream := uint32(2*i + 1)
			b.Write(frame(0x1, 0x4, stream, grpcHeaders(srv.Addr, "/retryd.v1.RetryService/AwaitRetry")))
			b.Write(frame(0x0, 0x1, stream, grpcMessage(t, &retrydv1.AwaitRetryRequest{RetryId: ids[next%slowSessions]})))
			next++
		}
		if _, err := c.Write(b.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	waitAwaiters(t, client, slowStreams/slowSessions)

	served(t, client, "during")
	during := measure(t, pid, srv.MetricsAddr)
	t.Logf("during (%d idle connections, %d unread AwaitRetry streams; server built with -race: %v): %v",
		idleConns, slowStreams, raceBuild(), during)

	// Cancelling the retries sends Cancelled to all 500 unread streams; the
	// server must not wedge on them.
	for i := range slowSessions {
		if _, err := client.CancelRetries(context.Background(), &retrydv1.CancelRetriesRequest{
			Target: &retrydv1.CancelRetriesRequest_SessionId{SessionId: fmt.Sprintf("slow-%d", i)}}); err != nil {
			t.Fatal(err)
		}
	}
	served(t, client, "after the cancellations")
	cancelled := measure(t, pid, srv.MetricsAddr)
	t.Logf("after cancelling the awaited retries: %v", cancelled)

	for _, m := range []memory{during, cancelled} {
		if m.rss > rssBound || m.peak > rssBound || m.goroutines > goroutineBound {
			t.Errorf("server %v, want under %d MiB and %d goroutines", m, rssBound>>20, goroutineBound)
		}
	}

	// Closing the attack's connections gives the goroutines back.
	closeAll(attack)
	attack = nil
	closed := measure(t, pid, srv.MetricsAddr)
	for deadline := time.Now().Add(10 * time.Second); closed.goroutines > before.goroutines+100 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		closed = measure(t, pid, srv.MetricsAddr)
	}
	t.Logf("after closing the attack's connections: %v", closed)
	served(t, client, "after closing")
	retrydtest.Verify(t, conn)
}

func closeAll(cs []io.Closer) {
	for _, c := range cs {
		c.Close()
	}
}

// raceBuild reports whether this test (and so the server retrydtest built
// for it) runs with the race detector, which multiplies memory use.
func raceBuild() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// served checks an ordinary client is served: a failure is scheduled with a
// 50 ms delay, awaited, and started, all within 10 s.
func served(t *testing.T, client retrydv1.RetryServiceClient, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	begin := time.Now()
	resp, err := client.FailedStep(ctx, &retrydv1.FailedStepRequest{
		SessionId: "ordinary-" + strings.ReplaceAll(when, " ", "-"), Turn: 1, Step: 1, Provider: "p",
		Failure:      &retrydv1.Failure{Code: "SERVER"},
		PolicySource: &retrydv1.FailedStepRequest_Policy{Policy: policy(50)},
	})
	if err != nil {
		t.Fatalf("%s: FailedStep: %v", when, err)
	}
	stream, err := client.AwaitRetry(ctx, &retrydv1.AwaitRetryRequest{RetryId: resp.GetDecision().GetSchedule().GetRetryId()})
	if err != nil {
		t.Fatalf("%s: AwaitRetry: %v", when, err)
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: AwaitRetry: %v (after %v)", when, err, time.Since(begin))
		}
		if m.GetStarted() != nil {
			break
		}
	}
	t.Logf("%s: an ordinary client was scheduled, awaited and started in %v", when, time.Since(begin).Round(time.Millisecond))
}

// waitAwaiters waits until every slow session's retry has n awaiters.
func waitAwaiters(t *testing.T, client retrydv1.RetryServiceClient, n uint32) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var total, short uint32
		for i := range slowSessions {
			resp, err := client.GetChains(context.Background(), &retrydv1.GetChainsRequest{SessionId: fmt.Sprintf("slow-%d", i)})
			if err != nil {
				t.Fatal(err)
			}
			got := resp.GetChains()[0].GetLatest().GetAwaiters()
			total += got
			if got < n {
				short++
			}
		}
		if short == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d awaiters attached, want %d", total, n*slowSessions)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// memory is what measure reads of the server process.
type memory struct {
	rss, peak  int64 // VmRSS and VmHWM, bytes
	threads    int
	goroutines float64
}

func (m memory) String() string {
	return fmt.Sprintf("RSS %.1f MiB (peak %.1f MiB), %d threads, %.0f goroutines",
		float64(m.rss)/(1<<20), float64(m.peak)/(1<<20), m.threads, m.goroutines)
}

// measure reads the server's resident memory from /proc/PID/status and its
// goroutines from its /metrics.
func measure(t *testing.T, pid int, metricsAddr string) memory {
	t.Helper()
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var m memory
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, value, _ := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(value)
		if len(fields) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(fields[0], 10, 64)
		switch name {
		case "VmRSS":
			m.rss = n << 10
		case "VmHWM":
			m.peak = n << 10
		case "Threads":
			m.threads = int(n)
		}
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m.goroutines = metricValue(string(body), "go_goroutines")
	return m
}

// raiseFileLimit raises this process's open-file limit (which the server
// inherits) to at least n, up to the hard limit.
func raiseFileLimit(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur >= n {
		return
	}
	if lim.Max < n {
		t.Skipf("open-file hard limit %d is below the %d this test needs", lim.Max, n)
	}
	lim.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
}

func nonce(t *testing.T) string {
	t.Helper()
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// childWithEnv finds the PID of this process's child whose environment
// holds kv.
func childWithEnv(t *testing.T, kv string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so cut at the last ')'.
		rest := stat[bytes.LastIndexByte(stat, ')')+1:]
		fields := strings.Fields(string(rest))
		if len(fields) < 2 || fields[1] != strconv.Itoa(self) {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		for v := range bytes.SplitSeq(env, []byte{0}) {
			if string(v) == kv {
				return pid
			}
		}
	}
	t.Fatalf("no child process with %s", kv)
	return 0
}

// frame encodes one HTTP/2 frame.
func frame(typ, flags byte, stream uint32, payload []byte) []byte {
	b := make([]byte, 9, 9+len(payload))
	b[0], b[1], b[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	b[3], b[4] = typ, flags
	binary.BigEndian.PutUint32(b[5:], stream&0x7fffffff)
	return append(b, payload...)
}

// setting encodes one SETTINGS parameter.
func setting(id uint16, value uint32) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint16(nil, id), value)
}

// grpcHeaders is the HPACK block of a gRPC request, every field a literal
// without indexing (no dynamic table, no Huffman coding).
func grpcHeaders(authority, path string) []byte {
	var b []byte
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", authority},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		b = append(b, 0, byte(len(f[0])))
		b = append(b, f[0]...)
		b = append(b, byte(len(f[1])))
		b = append(b, f[1]...)
	}
	return b
}

// grpcMessage is one length-prefixed, uncompressed gRPC message.
func grpcMessage(t *testing.T, m proto.Message) []byte {
	t.Helper()
	pb, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(pb))), pb...)
}
