// Command chaos runs lockbroker's chaos suite (see docs/chaos.md):
//
//	go run ./test/chaos/cmd/chaos -profile short            # the real thing
//	go run ./test/chaos/cmd/chaos -profile short -mutant no-fencing
//	go run ./test/chaos/cmd/chaos -profile short -mutants   # real, then every mutant
//
// It exits 0 when every checker passes (with -mutants: the real build
// passes and every mutant is caught by a checker paired with it,
// chaos.MutantCheckers), 1 on a violation (or an uncaught mutant; a single
// -mutant run exits 1 only when its own checker caught it), 2 when the run
// itself could not be carried out.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/test/chaos"
)

func main() {
	os.Exit(run())
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run() int {
	var (
		profile   = flag.String("profile", env("CHAOS_PROFILE", "short"), "short (≤3 min, with -race) or full (~20 min) (env CHAOS_PROFILE)")
		seedStr   = flag.String("seed", env("SEED", ""), "schedule seed; empty picks one and prints it (env SEED)")
		mutant    = flag.String("mutant", env("MUTANT", ""), "run one mutant: no-loss-notice, no-fencing, no-resume-fence, no-shared-queue, rw-reader-beside-writer, rw-stale-token, multi-partial (env MUTANT); the run must fail, in a checker paired with the mutant")
		mutants   = flag.Bool("mutants", false, "run the real build, then every mutant: fail if the real build fails or any mutant escapes its paired checkers")
		race      = flag.Bool("race", env("CHAOS_RACE", "1") != "0", "build the brokers with -race (env CHAOS_RACE=0 turns it off)")
		out       = flag.String("out", env("CHAOS_OUT", ""), "directory for logs and reports (default: a new temporary directory) (env CHAOS_OUT)")
		src       = flag.String("src", env("CHAOS_SRC", ""), "module root to build cmd/broker from (default: this repository) (env CHAOS_SRC)")
		brokerBin = flag.String("broker-bin", env("CHAOS_BROKER_BIN", ""), "use this broker binary instead of building one (real runs only)")
		duration  = flag.Duration("duration", 0, "override the profile's schedule length (env CHAOS_DURATION)")
		clients   = flag.Int("clients", 0, "override the number of Go (client/) lock clients (env CHAOS_CLIENTS)")
	)
	flag.Parse()
	if *duration == 0 {
		if d, err := time.ParseDuration(os.Getenv("CHAOS_DURATION")); err == nil {
			*duration = d
		}
	}
	if *clients == 0 {
		*clients, _ = strconv.Atoi(os.Getenv("CHAOS_CLIENTS"))
	}
	p, ok := chaos.Profiles[*profile]
	if !ok {
		fmt.Fprintf(os.Stderr, "chaos: unknown profile %q (short, full)\n", *profile)
		return 2
	}
	if *duration > 0 {
		p.Total = *duration
		if *duration < p.QuietLen+20*time.Second { // too short for a quiet period
			p.QuietLen, p.CheckLiveness = 0, false
		}
		p.ChaosLen = min(p.ChaosLen, *duration-p.QuietLen)
	}
	if *clients > 0 {
		p.Lib = *clients
	}
	var seed uint64
	if *seedStr == "" {
		seed = rand.Uint64() % 1_000_000_000
	} else {
		var err error
		if seed, err = strconv.ParseUint(*seedStr, 10, 64); err != nil {
			fmt.Fprintf(os.Stderr, "chaos: bad seed %q\n", *seedStr)
			return 2
		}
	}
	if *mutant != "" {
		if _, ok := chaos.Mutants[*mutant]; !ok {
			fmt.Fprintf(os.Stderr, "chaos: unknown mutant %q\n", *mutant)
			return 2
		}
	}
	if *src == "" {
		root, err := repoRoot()
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 2
		}
		*src = root
	}
	if *out == "" {
		dir, err := os.MkdirTemp("", "lockbroker-chaos-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 2
		}
		*out = dir
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Printf("chaos: seed %d (replay with SEED=%d), profile %s, output in %s\n", seed, seed, p.Name, *out)

	runs := []string{*mutant}
	if *mutants {
		runs = []string{"", "no-loss-notice", "no-fencing", "no-resume-fence", "no-shared-queue",
			"rw-reader-beside-writer", "rw-stale-token", "multi-partial"}
	}
	bins := map[string]string{}
	for _, m := range runs {
		tags := chaos.Mutants[m]
		if _, ok := bins[tags]; ok {
			continue
		}
		if tags == "" && *brokerBin != "" {
			bins[tags] = *brokerBin
			continue
		}
		fmt.Printf("chaos: building cmd/broker (race=%v, tags %q)\n", *race, tags)
		bin, err := chaos.BuildBroker(ctx, *src, *out, *race, tags)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 2
		}
		bins[tags] = bin
	}
	// The shared cluster, unless every run starts its own (a single
	// -mutant run of a quiet mutant).
	var shared *consultest.Cluster
	for _, m := range runs {
		if (m == "" && !p.OwnCluster) || (m != "" && !chaos.MutantProfile(m).OwnCluster) {
			cluster, err := chaos.StartCluster(ctx, filepath.Join(*out, "consul"), 0)
			if err != nil {
				fmt.Fprintln(os.Stderr, "chaos:", err)
				return 2
			}
			defer cluster.Close()
			shared = cluster.Cluster
			break
		}
	}

	status := 0
	var summary []string
	realFailed := map[string]bool{}
	one := func(m string, seed uint64, attempt int) (*chaos.Report, error) {
		rp, name := p, "real"
		if m != "" {
			rp, name = chaos.MutantProfile(m), "mutant-"+m
		}
		if attempt > 0 {
			name += fmt.Sprintf("-retry%d", attempt)
		}
		dir := filepath.Join(*out, name)
		rep, err := chaos.Run(ctx, chaos.Config{Profile: rp, Seed: seed, Mutant: m, BrokerBin: bins[chaos.Mutants[m]],
			OutDir: dir, Cluster: shared, Progress: os.Stdout})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if err := rep.WriteJSON(filepath.Join(dir, "report.json")); err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
		}
		return rep, nil
	}
	var muts []string
	for _, m := range runs {
		if m != "" {
			muts = append(muts, m)
			continue
		}
		rep, err := one("", seed, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 2
		}
		rep.Print(os.Stdout)
		fmt.Printf("report: %s\n", filepath.Join(rep.OutDir, "report.json"))
		failed := rep.Failed()
		for _, f := range failed {
			realFailed[f] = true
		}
		if len(failed) == 0 {
			summary = append(summary, "real build: PASS (every checker ok)")
		} else {
			summary = append(summary, "real build: FAIL, violations found by: "+strings.Join(failed, ", "))
			status = 1
		}
	}
	// The mutants run side by side on the shared cluster (their own
	// brokers, clients and keys): they are short and mostly waiting.
	reps := make([]*chaos.Report, len(muts))
	errs := make([]error, len(muts))
	var wg sync.WaitGroup
	for i, m := range muts {
		wg.Go(func() { reps[i], errs[i] = one(m, seed, 0) })
	}
	wg.Wait()
	// A mutant is caught only by a checker paired with it
	// (chaos.MutantCheckers): any other failure is reported but proves
	// nothing about the defect it plants.
	judge := func(m string, rep *chaos.Report) chaos.MutantVerdict {
		return chaos.JudgeMutant(m, rep.Failed(), realFailed)
	}
	for i, m := range muts {
		if errs[i] != nil {
			fmt.Fprintln(os.Stderr, "chaos:", errs[i])
			return 2
		}
		rep := reps[i]
		rep.Print(os.Stdout)
		fmt.Printf("report: %s\n", filepath.Join(rep.OutDir, "report.json"))
		v := judge(m, rep)
		// A schedule is random: the faults that expose a mutant may find
		// nothing to break (no live hold at that moment). With -mutants an
		// escaped mutant gets mutantRetries more runs with new seeds, and
		// is NOT CAUGHT only if every run misses it.
		for attempt := 1; !v.Caught && *mutants && attempt <= mutantRetries; attempt++ {
			s := seed + uint64(attempt)*7919
			fmt.Printf("chaos: mutant %s escaped its checker (%s) with seed %d; run %d of %d with seed %d\n",
				m, strings.Join(chaos.MutantCheckers[m], ", "), seed, attempt+1, mutantRetries+1, s)
			rep, err := one(m, s, attempt)
			if err != nil {
				fmt.Fprintln(os.Stderr, "chaos:", err)
				return 2
			}
			rep.Print(os.Stdout)
			v = judge(m, rep)
		}
		summary = append(summary, fmt.Sprintf("mutant %s: %s", m, v.String(m)))
		switch {
		case v.Caught && !*mutants:
			status = 1 // a single mutant run fails when caught, as it must
		case !v.Caught && *mutants:
			status = 1
		}
	}
	fmt.Println()
	for _, s := range summary {
		fmt.Println("chaos:", s)
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return 2
	}
	return status
}

// mutantRetries is how many more runs (new seeds) an escaped mutant gets
// with -mutants before it counts as NOT CAUGHT.
const mutantRetries = 2

// repoRoot finds the module root above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/lockbroker/lockbroker\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the lockbroker repository: pass -src")
		}
		dir = parent
	}
}
