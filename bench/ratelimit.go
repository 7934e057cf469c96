package bench

// The envoyproxy/ratelimit target of the Redis part (Config.RatelimitBin):
// the Redis-backed peer of docs/benchmarks.md, a gRPC service doing one
// Redis round trip per decision. The harness never builds or downloads it: it
// runs a binary the user built (docs/benchmarks.md says how), on the
// harness's redis-server, bound to loopback only, with a generated
// configuration of one domain and one descriptor, key "session", 100
// requests per minute. Each ShouldRateLimit call then carries one
// descriptor entry (session = a key of the same key space as the other
// targets), which ratelimit's fixed window turns into INCRBY and EXPIRE of
// one key in one pipeline: one round trip. Requests and responses are
// encoded with protowire, so the module needs no envoy dependency.

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
)

const (
	// ratelimitName is the target's name.
	ratelimitName = "ratelimit"
	// ratelimitMethod is envoyproxy/ratelimit's RPC (rls.proto v3).
	ratelimitMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	// ratelimitDomain and ratelimitKey are the configuration's domain and
	// descriptor key.
	ratelimitDomain = "retryd-bench"
	ratelimitKey    = "session"
)

// ratelimitConfig is the one configuration file: every value of the
// descriptor key "session" has its own fixed window of 100 per minute.
const ratelimitConfig = `domain: ` + ratelimitDomain + `
descriptors:
  - key: ` + ratelimitKey + `
    rate_limit:
      unit: minute
      requests_per_unit: 100
`

// RateLimitResponse.Code (rls.proto).
const (
	ratelimitOK        = 1
	ratelimitOverLimit = 2
)

// startRatelimit runs bin (envoyproxy/ratelimit's service_cmd) against
// redisAddr with its configuration in a directory under dir. Its gRPC,
// HTTP and debug (net/http/pprof) listeners are on free loopback ports,
// its stats sink and tracing are off. It returns once the gRPC port accepts connections.
func startRatelimit(ctx context.Context, bin, dir, redisAddr string, env []string) (*process, error) {
	runtimeRoot := filepath.Join(dir, "ratelimit-runtime")
	confDir := filepath.Join(runtimeRoot, "ratelimit", "config")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(confDir, "retryd-bench.yaml"), []byte(ratelimitConfig), 0o644); err != nil {
		return nil, err
	}
	var ports [3]string
	for i := range ports {
		addr, err := freeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		_, ports[i], _ = net.SplitHostPort(addr)
	}
	// Every setting that could reach beyond loopback or change the
	// per-call work is set explicitly, so the caller's environment cannot
	// change them (the last value of a key in cmd.Env wins).
	env = append(env,
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+ports[0], "GRPC_UDS=",
		"HOST=127.0.0.1", "PORT="+ports[1],
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+ports[2],
		"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SINGLE", "REDIS_URL="+redisAddr,
		"REDIS_AUTH=", "REDIS_TLS=false", "REDIS_PERSECOND=false", "REDIS_POOL_SIZE=10",
		"REDIS_PIPELINE_WINDOW=0", "LOCAL_CACHE_SIZE_IN_BYTES=0", "CACHE_KEY_PREFIX=",
		"CONFIG_TYPE=FILE", "RUNTIME_ROOT="+runtimeRoot, "RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_APPDIRECTORY=config", "RUNTIME_WATCH_ROOT=false",
		// No stats sink: with USE_STATSD=false alone ratelimit would log
		// every counter to stderr every 10 s. The counters still count.
		"USE_STATSD=false", "USE_DOG_STATSD=false", "USE_PROMETHEUS=false", "DISABLE_STATS=true",
		"TRACING_ENABLED=false", "LOG_LEVEL=warn", "LOG_FORMAT=text",
	)
	p, _, err := start(ctx, ratelimitName, bin, nil, env)
	if err != nil {
		return nil, err
	}
	p.addr = net.JoinHostPort("127.0.0.1", ports[0])
	// Its debug listener serves net/http/pprof, so --profile profiles it
	// like retryd.
	p.metricsAddr = net.JoinHostPort("127.0.0.1", ports[2])
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", p.addr, time.Second)
		if err == nil {
			c.Close()
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("%s exited before listening on %s:\n%s", ratelimitName, p.addr, p.logs.String())
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s did not listen on %s within 30s:\n%s", ratelimitName, p.addr, p.logs.String())
		}
	}
}

// ratelimitCaller sends ShouldRateLimit with one descriptor, session = a
// random key of the key space.
type ratelimitCaller struct{ keyedCaller }

func newRatelimitCaller(conn *grpc.ClientConn, id, workers, keySpace int, rng *rand.Rand, prefix string) caller {
	return &ratelimitCaller{newKeyedCaller(conn, keySpace, rng, prefix)}
}

func (c *ratelimitCaller) call(ctx context.Context) (bool, error) {
	req := ratelimitRequest(ratelimitDomain, ratelimitKey, c.key())
	var resp []byte
	if err := c.conn.Invoke(ctx, ratelimitMethod, &req, &resp, grpc.ForceCodecV2(rawCodec{})); err != nil {
		return true, fmt.Errorf("ShouldRateLimit: %w", err)
	}
	if _, err := ratelimitDecision(resp); err != nil {
		return true, fmt.Errorf("ShouldRateLimit: %w", err)
	}
	return true, nil
}

// ratelimitRequest encodes a RateLimitRequest{domain, descriptors: [{entries:
// [{key, value}]}]} (hits_addend unset: 1).
func ratelimitRequest(domain, key, value string) []byte {
	var entry []byte
	entry = protowire.AppendTag(entry, 1, protowire.BytesType) // Entry.key
	entry = protowire.AppendString(entry, key)
	entry = protowire.AppendTag(entry, 2, protowire.BytesType) // Entry.value
	entry = protowire.AppendString(entry, value)
	desc := protowire.AppendTag(nil, 1, protowire.BytesType) // RateLimitDescriptor.entries
	desc = protowire.AppendBytes(desc, entry)
	req := protowire.AppendTag(nil, 1, protowire.BytesType) // RateLimitRequest.domain
	req = protowire.AppendString(req, domain)
	req = protowire.AppendTag(req, 2, protowire.BytesType) // RateLimitRequest.descriptors
	return protowire.AppendBytes(req, desc)
}

// ratelimitDecision decodes a RateLimitResponse: its overall_code (1),
// which must be OK or OVER_LIMIT, and its first DescriptorStatus (2),
// which must carry a current_limit (2): without one the descriptor
// matched no limit of the configuration, and no Redis call was made.
func ratelimitDecision(b []byte) (code uint64, err error) {
	var status []byte
	var sawStatus bool
	if err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) {
		switch {
		case num == 1 && typ == protowire.VarintType:
			code = x
		case num == 2 && typ == protowire.BytesType && !sawStatus:
			status, sawStatus = v, true
		}
	}); err != nil {
		return 0, err
	}
	if code != ratelimitOK && code != ratelimitOverLimit {
		return code, fmt.Errorf("overall_code %d, want OK (1) or OVER_LIMIT (2)", code)
	}
	hasLimit := false
	if err := eachField(status, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) {
		if num == 2 && typ == protowire.BytesType {
			hasLimit = true
		}
	}); err != nil {
		return 0, err
	}
	if !hasLimit {
		return code, errors.New("the descriptor matched no configured limit (no current_limit)")
	}
	return code, nil
}

// eachField calls f with each field of the message b: for a bytes field
// its contents, for a varint its value.
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("undecodable response: %w", protowire.ParseError(n))
		}
		b = b[n:]
		switch typ {
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return fmt.Errorf("undecodable response: %w", protowire.ParseError(n))
			}
			f(num, typ, v, 0)
			b = b[n:]
		case protowire.VarintType:
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return fmt.Errorf("undecodable response: %w", protowire.ParseError(n))
			}
			f(num, typ, nil, x)
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("undecodable response: %w", protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	return nil
}

// checkLoopbackOnly returns an error naming every TCP or UDP socket of
// process pid whose local or remote address is not loopback (an unbound
// remote, 0.0.0.0:0 or [::]:0, is fine). It reads the socket inodes of
// /proc/<pid>/fd and the tables of /proc/<pid>/net.
func checkLoopbackOnly(pid int) error {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		if ino, ok := strings.CutPrefix(l, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	var bad []string
	for _, table := range []string{"tcp", "tcp6", "udp", "udp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue // no IPv6
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || !inodes[fields[9]] {
				continue
			}
			local, lok := procNetAddr(fields[1])
			remote, rok := procNetAddr(fields[2])
			if !lok || !rok || !local.IsLoopback() || !remote.IsLoopback() && !remote.IsUnspecified() {
				bad = append(bad, fmt.Sprintf("%s %s -> %s", table, fields[1], fields[2]))
			}
		}
		f.Close()
	}
	if len(bad) > 0 {
		return fmt.Errorf("pid %d has sockets beyond loopback: %s", pid, strings.Join(bad, "; "))
	}
	return nil
}

// procNetAddr parses the IP of an address of /proc/net/tcp*
// ("0100007F:1F90": the IP in host byte order by 32-bit words).
func procNetAddr(s string) (net.IP, bool) {
	h, _, ok := strings.Cut(s, ":")
	b, err := hex.DecodeString(h)
	if !ok || err != nil || len(b)%4 != 0 || len(b) == 0 {
		return nil, false
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	ip := net.IP(b)
	if v4 := ip.To4(); v4 != nil {
		ip = v4
	}
	return ip, true
}
