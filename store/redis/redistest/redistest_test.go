package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestRunReportsExit: a redis-server that cannot bind its port (here one
// this test holds) is reported as exited at once, which startEach takes
// as the cue to try another port, instead of after the PING deadline.
func TestRunReportsExit(t *testing.T) {
	Skip(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	began := time.Now()
	p, err := runAt("", "127.0.0.1", lis.Addr().(*net.TCPAddr).Port, []string{"--save", "", "--appendonly", "no"})
	if err == nil {
		p.stop()
		t.Fatal("redis-server started on a port that is taken")
	}
	if !errors.Is(err, errExited) {
		t.Fatalf("err = %v, want errExited", err)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("reported after %v: the PING deadline, not the exit", d)
	}
}

// TestImpostorRefusesReplication: an impostor serves a client's commands
// but never a replica's resynchronisation: the killed master's replica,
// which dials the impostor's address until it is promoted, would
// otherwise replace its data with the impostor's empty dataset (in
// TestClusterFailover, under load, one run in a few lost the awaited
// retry that way).
func TestImpostorRefusesReplication(t *testing.T) {
	s := Start(t)
	s.Stop()
	imp := s.Impostor(t)
	rc := redis.NewClient(&redis.Options{Addr: imp.Addr})
	defer rc.Close()
	ctx := context.Background()
	if err := rc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET on the impostor: %v", err)
	}
	for _, cmd := range [][]any{{"PSYNC", "?", "-1"}, {"SYNC"}} {
		err := rc.Do(ctx, cmd...).Err()
		if err == nil || !strings.Contains(err.Error(), "unknown command") {
			t.Errorf("%v on the impostor: %v, want an unknown command", cmd, err)
		}
	}
}

// TestDelayAndLoss: a PING over a delayed path takes about twice the
// one-way delay longer (each way held for delay ± jitter) and the other
// path is untouched; after Undelay it is fast again; with loss 1 every
// packet is dropped, and with loss 0 again nothing is.
func TestDelayAndLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: builds a network namespace")
	}
	s := StartInNamespace(t, 2)
	rtt := func(i int) time.Duration {
		c, err := net.DialTimeout("tcp", s.Addr(i), 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		r := bufio.NewReader(c)
		best := time.Hour
		for range 5 {
			began := time.Now()
			c.SetDeadline(began.Add(3 * time.Second))
			if _, err := io.WriteString(c, "PING\r\n"); err != nil {
				t.Fatal(err)
			}
			if _, err := r.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
			best = min(best, time.Since(began))
		}
		return best
	}
	const delay, jitter = 40 * time.Millisecond, 10 * time.Millisecond
	s.Delay(t, 0, delay, jitter)
	if d := rtt(0); d < 2*(delay-jitter) || d > 2*(delay+jitter)+50*time.Millisecond {
		t.Errorf("PING over the delayed path took %v, want about %v", d, 2*delay)
	} else {
		t.Logf("PING over the delayed path: %v", d)
	}
	if d := rtt(1); d > 20*time.Millisecond {
		t.Errorf("PING over the other path took %v, want it untouched", d)
	}
	s.Undelay(t, 0)
	if d := rtt(0); d > 20*time.Millisecond {
		t.Errorf("PING after Undelay took %v, want it fast", d)
	}

	s.Lose(t, 0, 1)
	if err := ping(s.Addr(0)); err == nil {
		t.Error("PING over a path losing every packet answered")
	}
	s.Lose(t, 0, 0)
	if err := ping(s.Addr(0)); err != nil {
		t.Errorf("PING after the loss ended: %v", err)
	}
}

// TestSubnetTakenElsewhere: another test process's namespace (built here
// by hand: one path, a redis-server behind it, as a benchmark's server)
// already holds the subnet this process would choose first for its next
// server, as two processes' PIDs can make them choose alike. Every path
// of the new server still reaches that server, not the other process's:
// a key written over path 1 is read over path 0.
func TestSubnetTakenElsewhere(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: builds network namespaces")
	}
	Skip(t)
	if os.Geteuid() != 0 {
		t.Skip("not root: building network namespaces needs root")
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	subnet := (os.Getpid()*7 + int(netSeq.Load()+1)) % 250 // the first choice (claimSubnet)
	ns := fmt.Sprintf("retrydtest-o%d", os.Getpid())
	host, inner := fmt.Sprintf("ro%dh", os.Getpid()%100000), fmt.Sprintf("ro%di", os.Getpid()%100000)
	run("netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", ns).Run() })
	run("link", "add", host, "type", "veth", "peer", "name", inner)
	t.Cleanup(func() { exec.Command("ip", "link", "delete", host).Run() })
	run("link", "set", inner, "netns", ns)
	run("addr", "add", fmt.Sprintf("10.250.%d.1/30", subnet), "dev", host)
	run("link", "set", host, "up")
	run("-n", ns, "addr", "add", fmt.Sprintf("10.250.%d.2/30", subnet), "dev", inner)
	run("-n", ns, "link", "set", inner, "up")
	other, err := runAt(ns, fmt.Sprintf("10.250.%d.2", subnet), redisPort,
		[]string{"--save", "", "--appendonly", "no", "--protected-mode", "no"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.stop)

	s := StartInNamespace(t, 2)
	ctx := context.Background()
	over := func(i int) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: s.Addr(i), MaxRetries: -1, DialTimeout: 2 * time.Second,
			ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
		t.Cleanup(func() { c.Close() })
		return c
	}
	if err := over(1).Set(ctx, "written", "over path 1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := over(0).Get(ctx, "written").Result()
	if err != nil || got != "over path 1" {
		t.Errorf("read over path 0: %q %v, want what was written over path 1: the path reaches another server", got, err)
	}
}
