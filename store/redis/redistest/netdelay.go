package redistest

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	nfqueue "github.com/florianl/go-nfqueue/v2"
	"github.com/mdlayher/netlink"
)

// Latency and loss on a path. This kernel may lack tc's netem; what it
// has is netfilter: iptables in the server's namespace sends a path's
// packets, each way, to an NFQUEUE queue, and a delayer of the test
// process (a netlink socket opened inside that namespace) holds each
// packet for the delay ± jitter before it lets it through. Loss is
// iptables' statistic match dropping packets at random, each way. The
// rules live in the server's namespace and go with it.

// queueLen bounds how many packets one queue holds: at 100 ms one way
// and a few thousand packets a second, a few hundred are held at once.
const queueLen = 16384

// Delay holds every packet of path i, each way, for delay ± jitter
// (uniformly drawn) before it passes: a round trip over the path takes
// about 2×delay longer. Packets keep their order within a direction (a
// packet is never released before the one queued ahead of it), as on a
// slow link. It lasts until the test ends or Undelay.
func (s *NetServer) Delay(t testing.TB, i int, delay, jitter time.Duration) {
	t.Helper()
	delayPath(t, s.ns, &s.paths[i], i, delay, jitter)
}

// delayPath delays path i, whose inner end is in namespace netns (see
// NetServer.Delay).
func delayPath(t testing.TB, netns string, p *netPath, i int, delay, jitter time.Duration) {
	t.Helper()
	if jitter > delay {
		t.Fatalf("redistest: jitter %v exceeds delay %v", jitter, delay)
	}
	undelayPath(t, p)
	ns, err := os.Open("/var/run/netns/" + netns)
	if err != nil {
		t.Fatalf("redistest: opening namespace %s: %v", netns, err)
	}
	defer ns.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var queues []*nfqueue.Nfqueue
	stop := func() {
		cancel()
		for _, q := range queues {
			q.Close()
		}
		wg.Wait()
	}
	for dir, rule := range [][]string{{"INPUT", "-i"}, {"OUTPUT", "-o"}} {
		num := uint16(100 + 2*i + dir)
		q, err := nfqueue.Open(&nfqueue.Config{
			NetNS: int(ns.Fd()), NfQueue: num, MaxQueueLen: queueLen,
			Copymode: nfqueue.NfQnlCopyMeta, Flags: nfqueue.NfQaCfgFlagGSO, WriteTimeout: time.Second,
		})
		if err != nil {
			stop()
			t.Fatalf("redistest: opening NFQUEUE %d in %s: %v", num, netns, err)
		}
		queues = append(queues, q)
		// A full socket buffer must not end the delayer: the kernel then
		// drops what it could not queue, which is loss, not a failure.
		if err := q.SetOption(netlink.NoENOBUFS, true); err != nil {
			stop()
			t.Fatalf("redistest: NFQUEUE %d: %v", num, err)
		}
		held := make(chan heldPacket, queueLen)
		var last time.Time // only the hook touches it
		hook := func(a nfqueue.Attribute) int {
			if a.PacketID == nil {
				return 0
			}
			at := time.Now().Add(delay - jitter + time.Duration(mrand.Int64N(int64(2*jitter)+1)))
			if at.Before(last) {
				at = last
			}
			last = at
			select {
			case held <- heldPacket{*a.PacketID, at}:
			default:
				q.SetVerdict(*a.PacketID, nfqueue.NfDrop)
			}
			return 0
		}
		failed := func(err error) int {
			if ctx.Err() != nil {
				return 1
			}
			// The hook ends: packets then stay queued, which the test sees
			// as a cut path.
			t.Logf("redistest: NFQUEUE %d in %s: %v", num, netns, err)
			return 1
		}
		if err := q.RegisterWithErrorFunc(ctx, hook, failed); err != nil {
			stop()
			t.Fatalf("redistest: NFQUEUE %d: %v", num, err)
		}
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case h := <-held:
					if d := time.Until(h.at); d > 0 {
						select {
						case <-ctx.Done():
							return
						case <-time.After(d):
						}
					}
					q.SetVerdict(h.id, nfqueue.NfAccept)
				}
			}
		})
		iptables(t, netns, "-A", rule[0], rule[1], p.inner, "-j", "NFQUEUE", "--queue-num", fmt.Sprint(num))
	}
	p.undelay = func(t testing.TB) {
		for dir, rule := range [][]string{{"INPUT", "-i"}, {"OUTPUT", "-o"}} {
			iptables(t, netns, "-D", rule[0], rule[1], p.inner, "-j", "NFQUEUE", "--queue-num", fmt.Sprint(100+2*i+dir))
		}
		stop()
	}
	t.Cleanup(func() { undelayPath(t, p) })
}

// heldPacket is a packet the delayer holds until at.
type heldPacket struct {
	id uint32
	at time.Time
}

// Undelay lets path i's packets through at once again; packets held
// still pass at their time.
func (s *NetServer) Undelay(t testing.TB, i int) {
	t.Helper()
	undelayPath(t, &s.paths[i])
}

func undelayPath(t testing.TB, p *netPath) {
	t.Helper()
	if p.undelay != nil {
		p.undelay(t)
		p.undelay = nil
	}
}

// Lose drops each packet of path i, each way, with probability p (0
// stops the loss): a TCP connection over it retransmits, so its round
// trips take now and then a retransmission timeout longer.
func (s *NetServer) Lose(t testing.TB, i int, p float64) {
	t.Helper()
	losePath(t, s.ns, &s.paths[i], p)
}

// losePath sets the loss of path, whose inner end is in namespace netns
// (see NetServer.Lose).
func losePath(t testing.TB, netns string, path *netPath, p float64) {
	t.Helper()
	rules := func(op string) {
		prob := fmt.Sprintf("%.4f", path.loss)
		iptables(t, netns, op, "INPUT", "-i", path.inner, "-m", "statistic", "--mode", "random", "--probability", prob, "-j", "DROP")
		iptables(t, netns, op, "OUTPUT", "-o", path.inner, "-m", "statistic", "--mode", "random", "--probability", prob, "-j", "DROP")
	}
	if path.loss > 0 {
		rules("-D")
	}
	path.loss = p
	if p > 0 {
		// Inserted ahead of the delayer's rules: a lost packet is not
		// held first.
		rules("-I")
	}
}

// iptables runs iptables with args inside namespace netns.
func iptables(t testing.TB, netns string, args ...string) {
	t.Helper()
	args = append([]string{"netns", "exec", netns, "iptables", "-w"}, args...)
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("iptables %s: %v: %s", strings.Join(args[3:], " "), err, out)
	}
}
