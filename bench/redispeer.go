package bench

// The Redis part of the benchmark (Config.RedisPeer): one redis-server of
// the harness's own on a free loopback port; retryd on --store redis://…
// against it (target "retryd@redis"), and, as a one-round-trip peer,
// redis-benchmark running EVALSHA of a small token-bucket Lua
// script against the same server (target "redis EVALSHA"), one random key
// of the same key space per call, as many connections as the harness has
// workers, no pipelining: one network round trip per decision. Both phases
// read Redis' own counters (INFO stats and commandstats) and its CPU time
// before and after, so the table shows Redis commands, read events and
// Redis CPU per decision of each.

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// retrydRedisName and peerName are the targets of the Redis part.
	retrydRedisName = "retryd@redis"
	peerName        = "redis EVALSHA"
)

// tokenBucketLua is the peer's decision: a token bucket in one hash per
// key (capacity ARGV[1], refill ARGV[2] tokens per ms, key TTL ARGV[3]
// ms), read, refilled, taken from and written back in one script, so one
// EVALSHA is one decision and one round trip (envoyproxy/ratelimit's
// fixed window is INCRBY+EXPIRE in one pipeline: one round trip too).
const tokenBucketLua = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap = tonumber(ARGV[1])
local b = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(b[1]) or cap
local ts = tonumber(b[2]) or now
tokens = math.min(cap, tokens + (now - ts) * tonumber(ARGV[2]))
local ok = 0
if tokens >= 1 then tokens = tokens - 1; ok = 1 end
redis.call('HSET', KEYS[1], 't', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return ok`

// RedisStats are Redis' own counters over one phase.
type RedisStats struct {
	// Commands are the calls of every command (commandstats), INFO
	// excluded; commands a script runs count too.
	Commands int64
	// ByCommand are the calls per command (commandstats), INFO excluded.
	ByCommand map[string]int64
	// UsecByCommand is the time Redis spent in each command, in
	// microseconds (commandstats' usec), INFO excluded. A script's time
	// includes the commands it calls, which count under their own names
	// too.
	UsecByCommand map[string]int64
	// Failed are failed plus rejected calls (commandstats).
	Failed int64
	// Reads are total_reads_processed: read events on client sockets.
	// A client that waits for each reply before it sends again (as
	// redis-benchmark -P 1 and go-redis do) causes one read per round trip,
	// more when a request is larger than Redis' 16 KiB query buffer or
	// arrives in pieces. It includes the harness's two INFO calls.
	Reads int64
	// NetIn and NetOut are total_net_input_bytes and total_net_output_bytes.
	NetIn, NetOut int64
	// CPU is redis-server's utime+stime in seconds.
	CPU float64
}

// redisServer is the harness's redis-server.
type redisServer struct {
	proc *process
	addr string
	rdb  *redis.Client
	sha  string
}

// startRedis runs redis-server on a free loopback port, without snapshots
// or an append-only file, and loads the peer's script.
func startRedis(ctx context.Context) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("bench: --redis-peer needs redis-server on PATH (apt-get install redis-server)")
	}
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		return nil, errors.New("bench: --redis-peer needs redis-benchmark on PATH (apt-get install redis-tools)")
	}
	addr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	p, _, err := start(ctx, "redis-server", bin,
		[]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning"}, nil)
	if err != nil {
		return nil, err
	}
	p.addr = addr
	rs := &redisServer{proc: p, addr: addr, rdb: redis.NewClient(&redis.Options{Addr: addr, PoolSize: 2})}
	deadline := time.Now().Add(10 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err := rs.rdb.Ping(cctx).Err()
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			rs.stop()
			return nil, fmt.Errorf("redis-server on %s does not answer PING: %w\n%s", addr, err, p.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if rs.sha, err = rs.rdb.ScriptLoad(ctx, tokenBucketLua).Result(); err != nil {
		rs.stop()
		return nil, fmt.Errorf("SCRIPT LOAD: %w", err)
	}
	return rs, nil
}

// stop closes the client and stops redis-server by its PID.
func (rs *redisServer) stop() {
	rs.rdb.Close()
	rs.proc.stop()
}

// snapshot reads Redis' counters and CPU time.
func (rs *redisServer) snapshot(ctx context.Context) (RedisStats, error) {
	info, err := rs.rdb.Info(ctx, "stats", "commandstats").Result()
	if err != nil {
		return RedisStats{}, fmt.Errorf("redis INFO: %w", err)
	}
	st := parseRedisInfo(info)
	if st.CPU, err = rs.proc.cpuSeconds(); err != nil {
		return RedisStats{}, err
	}
	return st, nil
}

// parseRedisInfo reads the counters RedisStats keeps from INFO output.
func parseRedisInfo(info string) RedisStats {
	st := RedisStats{ByCommand: map[string]int64{}, UsecByCommand: map[string]int64{}}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if cmd, ok := strings.CutPrefix(k, "cmdstat_"); ok {
			if cmd == "info" {
				continue
			}
			for _, f := range strings.Split(v, ",") {
				fk, fv, _ := strings.Cut(f, "=")
				n, _ := strconv.ParseInt(fv, 10, 64)
				switch fk {
				case "calls":
					st.ByCommand[cmd] += n
					st.Commands += n
				case "usec":
					st.UsecByCommand[cmd] += n
				case "failed_calls", "rejected_calls":
					st.Failed += n
				}
			}
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "total_reads_processed":
			st.Reads = n
		case "total_net_input_bytes":
			st.NetIn = n
		case "total_net_output_bytes":
			st.NetOut = n
		}
	}
	return st
}

// sub is s − before.
func (s RedisStats) sub(before RedisStats) RedisStats {
	d := RedisStats{
		Commands: s.Commands - before.Commands, Failed: s.Failed - before.Failed, Reads: s.Reads - before.Reads,
		NetIn: s.NetIn - before.NetIn, NetOut: s.NetOut - before.NetOut, CPU: s.CPU - before.CPU,
		ByCommand: map[string]int64{}, UsecByCommand: map[string]int64{},
	}
	for k, v := range s.ByCommand {
		if n := v - before.ByCommand[k]; n != 0 {
			d.ByCommand[k] = n
		}
	}
	for k, v := range s.UsecByCommand {
		if n := v - before.UsecByCommand[k]; n != 0 {
			d.UsecByCommand[k] = n
		}
	}
	return d
}

// peerRun is one redis-benchmark run's outcome.
type peerRun struct {
	elapsed  time.Duration
	rps      float64 // redis-benchmark's own figure
	p50, p99 time.Duration
}

// runRedisBenchmark runs n EVALSHA calls of the token bucket over conns
// connections, on keys prefix+0…keySpace-1.
func runRedisBenchmark(ctx context.Context, rs *redisServer, conns, keySpace, n int, prefix string) (peerRun, error) {
	host, port, _ := net.SplitHostPort(rs.addr)
	args := []string{"-h", host, "-p", port, "-c", strconv.Itoa(conns), "-n", strconv.Itoa(n),
		"-r", strconv.Itoa(keySpace), "-P", "1", "--csv", "--precision", "3",
		// capacity 100, refilled at 100 per minute, key TTL 1 h
		"EVALSHA", rs.sha, "1", prefix + "__rand_int__", "100", strconv.FormatFloat(100.0/60_000, 'g', -1, 64), "3600000"}
	cmd := exec.CommandContext(ctx, "redis-benchmark", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	t0 := time.Now()
	err := cmd.Run()
	run := peerRun{elapsed: time.Since(t0)}
	if err != nil {
		return run, fmt.Errorf("redis-benchmark: %w\n%s", err, stderr.String())
	}
	if s := strings.TrimSpace(stderr.String()); s != "" {
		return run, fmt.Errorf("redis-benchmark: %s", s)
	}
	recs, err := csv.NewReader(&stdout).ReadAll()
	if err != nil || len(recs) < 2 || len(recs[0]) != len(recs[1]) {
		return run, fmt.Errorf("redis-benchmark: unexpected output %q", stdout.String())
	}
	col := map[string]string{}
	for i, h := range recs[0] {
		col[h] = recs[1][i]
	}
	ms := func(k string) time.Duration {
		f, _ := strconv.ParseFloat(col[k], 64)
		return time.Duration(f * float64(time.Millisecond))
	}
	run.rps, _ = strconv.ParseFloat(col["rps"], 64)
	run.p50, run.p99 = ms("p50_latency_ms"), ms("p99_latency_ms")
	return run, nil
}

// runPeerPhase runs the peer in saturation: a warm-up, then the measured
// run. redis-benchmark takes a number of calls, not a duration, so each
// run's count is the last run's rate times the time it should take (the
// first warm-up guesses 5 000/s); rps is calls over the measured run's
// wall time, process start and connection set-up included.
func runPeerPhase(ctx context.Context, t *target, cfg Config, round int, prefix string) (Result, error) {
	res := Result{Target: t.name, Mode: "saturation", Round: round}
	rs := t.redis
	count := func(d time.Duration) int { return max(int(t.peerRate*d.Seconds()), 200) }
	if t.peerRate == 0 {
		t.peerRate = 5000
	}
	if cfg.Warmup > 0 {
		w, err := runRedisBenchmark(ctx, rs, cfg.Workers, cfg.KeySpace, count(cfg.Warmup), prefix)
		if err != nil {
			return res, err
		}
		if w.rps > 0 {
			t.peerRate = w.rps
		}
	}
	before, err := rs.snapshot(ctx)
	if err != nil {
		return res, err
	}
	n := count(cfg.Duration)
	run, err := runRedisBenchmark(ctx, rs, cfg.Workers, cfg.KeySpace, n, prefix)
	if err != nil {
		return res, err
	}
	after, err := rs.snapshot(ctx)
	if err != nil {
		return res, err
	}
	d := after.sub(before)
	if run.rps > 0 {
		t.peerRate = run.rps
	}
	// Redis' own count of the calls, and of the failed ones, is the
	// authority: redis-benchmark stops at a server error without failing.
	res.Calls, res.Measured = d.ByCommand["evalsha"], d.ByCommand["evalsha"]
	res.Errors = d.Failed + max(int64(n)-res.Calls, 0)
	if res.Errors > 0 {
		res.FirstError = fmt.Sprintf("%d of %d EVALSHA calls reached Redis, %d failed", res.Calls, n, d.Failed)
	}
	res.Elapsed, res.P50, res.P99 = run.elapsed, run.p50, run.p99
	res.ServerCPU = d.CPU
	res.Redis = &d
	return res, nil
}
