package redis

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/retryd/retryd/store/redis/redistest"
)

// BenchmarkCommitScriptCost measures what Redis spends on commitScript as
// a function of one thing at a time, for the cost model in
// docs/benchmarks.md. Each sub-benchmark runs group commits shaped like
// the store's (see group.go): per script, the partition counter's check
// (GET), its SET, one XADD of the group's events and one PUBLISH; per
// decision, the session snapshot's revision check (GETRANGE), the
// snapshot's SET with its TTL and the session timer's ZADD. One knob
// differs from the baseline (11 decisions per script, as the store groups
// them at saturation; 1 350-byte snapshots; no extra calls or keys):
//
//   - group: decisions per script;
//   - snapshot: bytes of each decision's snapshot (through ARGV, Lua and SET);
//   - calls: extra redis.call per decision (PEXPIRE of its session key);
//   - keys: extra KEYS per script, which the script never touches;
//   - checks: extra checks per decision that call nothing (kind w: a KEYS
//     entry and one turn of the script's loop each);
//   - transaction: the same writes as MULTI … EXEC under WATCH, no script;
//   - ratelimit: envoyproxy/ratelimit's INCRBY and EXPIRE per decision.
//
// One client runs the scripts one after another against a redis-server of
// its own, so Redis' counters hold nothing else. Per script it reports
// redis-server's CPU time (INFO cpu: utime+stime), the script's median
// time inside Redis (INFO latencystats, the commands it calls included)
// and the mean time of those commands (INFO commandstats): the first
// minus the second is the script's own work. Run it with
//
//	go test -run '^$' -bench CommitScriptCost -benchtime 3000x -count 5 ./store/redis/
func BenchmarkCommitScriptCost(b *testing.B) {
	base := scriptShape{group: 11, snapshot: 1350}
	shapes := []struct {
		name  string
		shape scriptShape
	}{{"baseline", base}}
	vary := func(knob string, values []int, set func(*scriptShape, int)) {
		for _, v := range values {
			s := base
			set(&s, v)
			shapes = append(shapes, struct {
				name  string
				shape scriptShape
			}{fmt.Sprintf("%s=%d", knob, v), s})
		}
	}
	vary("group", []int{1, 2, 4, 8, 16, 32}, func(s *scriptShape, v int) { s.group = v })
	vary("snapshot", []int{64, 512, 4096, 16384}, func(s *scriptShape, v int) { s.snapshot = v })
	vary("calls", []int{1, 2, 4, 8}, func(s *scriptShape, v int) { s.calls = v })
	vary("keys", []int{11, 44, 176}, func(s *scriptShape, v int) { s.keys = v })
	vary("checks", []int{1, 2, 4, 8}, func(s *scriptShape, v int) { s.checks = v })
	base.transaction = true
	shapes = append(shapes, struct {
		name  string
		shape scriptShape
	}{"transaction", base})
	vary("transaction,group", []int{1, 32}, func(s *scriptShape, v int) { s.group = v })
	vary("transaction,snapshot", []int{64, 16384}, func(s *scriptShape, v int) { s.snapshot = v })
	shapes = append(shapes, struct {
		name  string
		shape scriptShape
	}{"ratelimit", scriptShape{group: 1, ratelimit: true}})
	srv := redistest.Start(b)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	b.Cleanup(func() { rdb.Close() })
	for _, s := range shapes {
		b.Run(s.name, func(b *testing.B) { benchScript(b, rdb, s.shape) })
	}
}

// scriptShape is one sub-benchmark of BenchmarkCommitScriptCost.
type scriptShape struct {
	group    int // decisions per script
	snapshot int // bytes of each decision's snapshot
	calls    int // extra redis.call per decision
	keys     int // extra, untouched KEYS per script
	checks   int // extra checks per decision that call nothing (3 ARGV each)
	// transaction: the same writes, unchecked, as MULTI … EXEC on a
	// connection that WATCHes one fencing key, instead of the script.
	transaction bool
	// ratelimit: instead of a commit, what envoyproxy/ratelimit sends
	// Redis per decision (INCRBY and EXPIRE of one key in one round trip),
	// to compare with on the same server and client.
	ratelimit bool
}

// benchScript runs b.N commit scripts of shape s over a key space of its
// own and reports Redis' costs per script and per decision.
func benchScript(b *testing.B, rdb *goredis.Client, s scriptShape) {
	ctx := context.Background()
	p := redistest.Prefix()
	const sessions = 10000 // as retryd-bench's default key space
	counter, stream, timers, channel := p+"seq", p+"events", p+"timers", p+"notify"
	// Each session key holds a snapshot ending with its revision; the
	// script's check compares that, so the replica tracks it as the store
	// does (checkLarge, setSnapshot).
	revisions := make([]string, sessions)
	body := strings.Repeat("x", max(s.snapshot-len(revisionHead)-revisionLen, 0))
	snapshot := func(i int) []byte {
		snap := append([]byte(body), revisionHead...)
		snap = append(snap, newRevision()...)
		revisions[i] = revisionSuffix(snap)
		return snap
	}
	pipe := rdb.Pipeline()
	for i := range sessions {
		pipe.Set(ctx, p+"s:"+strconv.Itoa(i), snapshot(i), time.Hour)
		pipe.ZAdd(ctx, timers, goredis.Z{Score: float64(i), Member: strconv.Itoa(i)})
	}
	pipe.Set(ctx, counter, "0", 0)
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	// A transaction's connection watches the fencing key from one commit
	// to the next: a writer that took the partition over would change it,
	// and the next EXEC would then write nothing.
	fence := p + "fence"
	conn := rdb.Conn()
	b.Cleanup(func() { conn.Close() })
	if err := conn.Do(ctx, "WATCH", fence).Err(); err != nil {
		b.Fatal(err)
	}
	seq := 0
	event := strings.Repeat("e", 180) // one decision's event, about its size
	next := 0
	commitOne := func() {
		if s.ratelimit {
			key := p + "rl:" + strconv.Itoa(next%sessions)
			next++
			if _, err := rdb.Pipelined(ctx, func(pipe goredis.Pipeliner) error {
				pipe.IncrBy(ctx, key, 1)
				pipe.Expire(ctx, key, time.Minute)
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			return
		}
		c := newCommit()
		c.checkValue(counter, strconv.Itoa(seq))
		for range s.keys {
			c.key(p + "untouched:" + strconv.Itoa(len(c.keys)))
		}
		var events strings.Builder
		for range s.group {
			i := next % sessions
			next++
			key := p + "s:" + strconv.Itoa(i)
			c.checkLarge(key, "", revisions[i])
			c.setSnapshot(ctx, key, snapshot(i), time.Hour)
			c.ZAdd(ctx, timers, float64(sessions+next), strconv.Itoa(i))
			for range s.calls {
				c.PExpire(ctx, key, time.Hour)
			}
			for range s.checks {
				c.checkAwaiters(key+":w", nil)
			}
			events.WriteString(event)
		}
		seq += s.group
		c.Set(ctx, counter, strconv.Itoa(seq), 0)
		c.XAdd(ctx, stream, []any{"MAXLEN", "~", 10000}, strconv.Itoa(seq)+"-0", "e", []byte(events.String()))
		c.Publish(ctx, channel, "")
		if s.transaction {
			transact(b, conn, fence, c)
			return
		}
		if _, err := c.run(ctx, rdb); err != nil {
			b.Fatal(err)
		}
	}
	commitOne() // loads the script
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	// The machine is shared: a script preempted midway counts its wait in
	// Redis' clock, and a batch that shared its core with others more CPU
	// time. So the CPU time is read per batch of scripts and its lower
	// quartile kept, and a script's time is Redis' median (INFO
	// latencystats), which preemption of a few does not move. The commands
	// a script calls take a microsecond or less, below the median's
	// resolution and too short to be preempted often: their mean counts.
	const batch = 100
	var perScript []float64
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(batch, b.N-done)
		cpu := redisCPUSeconds(b, rdb)
		for range n {
			commitOne()
		}
		perScript = append(perScript, (redisCPUSeconds(b, rdb)-cpu)*1e6/float64(n))
		done += n
	}
	b.StopTimer()
	slices.Sort(perScript)
	cpu := perScript[len(perScript)/4]
	stats := commandStats(b, rdb)
	commit := "evalsha"
	switch {
	case s.transaction:
		commit = "exec"
	case s.ratelimit:
		commit = "incrby"
	}
	if got := stats[commit].calls; got != int64(b.N) {
		b.Fatalf("commandstats count %d %s, want %d", got, commit, b.N)
	}
	scripts := float64(b.N)
	var called float64
	for name, st := range stats {
		switch name {
		case "evalsha", "exec", "multi", "watch", "info", "config|resetstat":
		default:
			called += st.usec / scripts
		}
	}
	b.ReportMetric(cpu, "redis-cpu-µs/script")
	b.ReportMetric(stats[commit].p50, "commit-µs/script")
	b.ReportMetric(called, "called-µs/script")
	b.ReportMetric(stats[commit].p50-called, "own-µs/script")
	b.ReportMetric(cpu/float64(s.group), "redis-cpu-µs/decision")
}

// transact sends c's writes, without its checks, as MULTI … EXEC followed
// by a WATCH of fence for the next one, in one round trip.
func transact(b *testing.B, conn *goredis.Conn, fence string, c *commit) {
	ctx := context.Background()
	cmds, err := conn.Pipelined(ctx, func(pipe goredis.Pipeliner) error {
		pipe.Do(ctx, "MULTI")
		for _, w := range c.commands() {
			pipe.Do(ctx, w...)
		}
		pipe.Do(ctx, "EXEC")
		pipe.Do(ctx, "WATCH", fence)
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	if res, _ := cmds[len(cmds)-2].(*goredis.Cmd).Result(); res == nil {
		b.Fatal("EXEC wrote nothing: the fencing key changed")
	}
}

// commands returns c's writes as the commands the script runs for them.
func (c *commit) commands() [][]any {
	var cmds [][]any
	plan, args := c.writePlan, c.writes
	take := func(n int) []any {
		taken := args[:n]
		args = args[n:]
		return taken
	}
	for len(plan) > 0 {
		form, i := plan[0], int(plan[1])<<8|int(plan[2])
		plan = plan[3:]
		var key []any
		if i > 0 {
			key = []any{c.keys[i-1]}
		}
		var cmd []any
		switch form {
		case 'P':
			v := take(2)
			cmd = append(append([]any{"SET"}, key...), v[0], "PX", v[1])
		case 'S':
			cmd = append(append([]any{"SET"}, key...), take(1)...)
		case 'Z':
			cmd = append(append([]any{"ZADD"}, key...), take(2)...)
		default:
			v := take(int(plan[0])<<8 | int(plan[1]))
			plan = plan[2:]
			cmd = append(append(append([]any{}, v[0]), key...), v[1:]...)
		}
		cmds = append(cmds, cmd)
	}
	return cmds
}

// redisCPUSeconds is redis-server's CPU time so far (INFO cpu).
func redisCPUSeconds(b *testing.B, rdb *goredis.Client) float64 {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		for _, field := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), field); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				total += f
			}
		}
	}
	return total
}

// commandStat is a command's calls (INFO commandstats) and median time
// in µs (INFO latencystats).
type commandStat struct {
	calls int64
	usec  float64 // the sum of its calls' times
	p50   float64
}

// commandStats reads INFO commandstats and latencystats, by command name.
func commandStats(b *testing.B, rdb *goredis.Client) map[string]commandStat {
	info, err := rdb.Info(context.Background(), "commandstats", "latencystats").Result()
	if err != nil {
		b.Fatal(err)
	}
	stats := map[string]commandStat{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		fields, want := []string{"calls", "usec"}, "cmdstat_"
		if strings.HasPrefix(name, "latency_") {
			fields, want = []string{"p50"}, "latency_percentiles_usec_"
		}
		name, found := strings.CutPrefix(name, want)
		if !found {
			continue
		}
		st := stats[name]
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch {
			case !slices.Contains(fields, k):
				continue
			case k == "calls":
				st.calls, err = strconv.ParseInt(v, 10, 64)
			case k == "usec":
				st.usec, err = strconv.ParseFloat(v, 64)
			default:
				st.p50, err = strconv.ParseFloat(v, 64)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		stats[name] = st
	}
	return stats
}
