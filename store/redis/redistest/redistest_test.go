package redistest

import (
	"errors"
	"net"
	"testing"
	"time"
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
	p, err := run(lis.Addr().(*net.TCPAddr).Port, []string{"--save", "", "--appendonly", "no"})
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
