package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/campaignctl/campaignctl/codes"
)

func (a *app) newCodesCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "codes", Short: "Promo code pools: generate, import, stats", Example: `  campaignctl codes generate --pool yaz --count 100000 --prefix YAZ-
  campaignctl codes stats --json`}
	cmd.AddCommand(a.newCodesGenerateCmd(), a.newCodesImportCmd(), a.newCodesStatsCmd())
	return cmd
}

type codesGenerateOptions struct {
	pool   string
	count  int
	prefix string
	length int
	// countSet says whether --count was given.
	countSet bool
}

// validatePool checks a --pool flag that names a pool to add codes to.
func validatePool(pool string) error {
	if pool == "" {
		return usagef("--pool is required: the name of the pool to add the codes to")
	}
	if !codes.ValidPoolName(pool) {
		return usagef("--pool %q: a pool name is 1 to %d characters of a-z, 0-9, '_' and '-'", pool, codes.MaxPoolNameLen)
	}
	return nil
}

func (o *codesGenerateOptions) validate() error {
	if err := validatePool(o.pool); err != nil {
		return err
	}
	if o.count < 1 {
		if !o.countSet {
			return usagef("--count is missing: give the number of new codes to make (--count 100000)")
		}
		return usagef("--count %d: give the number of new codes to make (at least 1)", o.count)
	}
	if o.length < codes.MinLength || o.length > codes.MaxLength {
		// The library takes 0 for its default; a --length 0 given here is a mistake, not a request for it.
		return usagef("--length %d: the random part is %d to %d characters (default %d)", o.length, codes.MinLength, codes.MaxLength, codes.DefaultLength)
	}
	// The rest (--length, --prefix, the most codes a run makes) before anything connects.
	if err := (codes.GenerateOptions{Pool: o.pool, Count: o.count, Prefix: o.prefix, Length: o.length}).Check(); err != nil {
		return usageError{err}
	}
	return nil
}

func (a *app) newCodesGenerateCmd() *cobra.Command {
	var o codesGenerateOptions
	cmd := &cobra.Command{
		Use:     "generate --pool P --count N",
		Short:   "Make N new unique codes (crypto-random, no look-alike characters); creates the pool if new",
		Example: `  campaignctl codes generate --pool yaz2026 --count 1000000 --prefix YAZ-`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.countSet = cmd.Flags().Changed("count")
			if err := o.validate(); err != nil {
				return err
			}
			pool, err := a.openEngine(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			bar := a.taskBar(int64(o.count), "generating codes")
			rep, err := codes.Generate(cmd.Context(), pool, codes.GenerateOptions{
				Pool: o.pool, Count: o.count, Prefix: o.prefix, Length: o.length,
				Progress: func(done int) { bar.Set(done) }, //nolint:errcheck
			})
			bar.Finish() //nolint:errcheck
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "pool %s: %d new codes\n", o.pool, rep.Generated)
			return nil
		},
	}
	poolVar(cmd.Flags(), &o.pool, "pool", "", "pool name")
	cmd.Flags().IntVar(&o.count, "count", 0, "how many new codes")
	cmd.Flags().StringVar(&o.prefix, "prefix", "", "optional prefix, e.g. YAZ-")
	cmd.Flags().IntVar(&o.length, "length", 8, "length of the random part")
	return cmd
}

type codesImportOptions struct {
	pool string
	file string
}

func (o *codesImportOptions) validate() error {
	if err := validatePool(o.pool); err != nil {
		return err
	}
	if o.file == "" {
		return usagef("give the file of codes: campaignctl codes import --pool %s FILE", o.pool)
	}
	return nil
}

func (a *app) newCodesImportCmd() *cobra.Command {
	var o codesImportOptions
	cmd := &cobra.Command{
		Use:   "import --pool P FILE",
		Short: "Add the codes of a file, one a line, to a pool; creates the pool if new; all or nothing",
		Long: fmt.Sprintf(`Add the codes of FILE, one code a line, to the pool P. The pool is created if it does not exist yet.

Each line is trimmed and blank lines are skipped, and so is a first line that names the column (code,
promo_code, kupon, ...). A code is %d to %d characters of A-Z, a-z, 0-9, '-' and '_';
case is kept and matters. Codes that are already stored (in this pool or any other) or that repeat in the
file are skipped and counted as already known. The import is all or nothing: a bad line stops it, names the
line, and no code of the file is added.`, codes.MinImportLength, codes.MaxImportLength),
		Example: `  campaignctl codes import --pool yaz2026 partner-codes.txt
  # partner-codes.txt:
  #   YAZ-7K2M9QH4
  #   YAZ-P3XW8RTD`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("give one file of codes, not %d (one code a line)", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				o.file = args[0]
			}
			if err := o.validate(); err != nil {
				return err
			}
			return a.codesImport(cmd, o)
		},
	}
	poolVar(cmd.Flags(), &o.pool, "pool", "", "pool to add the codes to (created if new)")
	return cmd
}

func (a *app) codesImport(cmd *cobra.Command, o codesImportOptions) error {
	f, err := os.Open(o.file)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return usagef("cannot read the code file %s: %v", o.file, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.IsDir() {
		return usagef("cannot read the code file %s: it is a directory; give a file with one code a line", o.file)
	}
	pool, err := a.openEngine(cmd.Context())
	if err != nil {
		return err
	}
	defer pool.Close()

	// Import streams the file through COPY without telling how far it is, so the bar counts the lines
	// read from the file (a little ahead of what Postgres has received).
	bar := a.taskBar(-1, "importing codes")
	r := &lineCounter{r: f, report: func(lines int64) { bar.Set64(lines) }} //nolint:errcheck
	rep, err := codes.Import(cmd.Context(), pool, o.pool, r)
	bar.Finish() //nolint:errcheck
	if err != nil {
		var le *codes.LineError
		if errors.As(err, &le) {
			return fmt.Errorf("%s: %w; fix that line and import the file again (nothing was imported)", o.file, err)
		}
		return fmt.Errorf("%s: %w (nothing was imported)", o.file, err)
	}
	if rep.SkippedHeader != "" {
		fmt.Fprintf(a.stderr, "note: the first line %q names the column and was not imported as a code\n", rep.SkippedHeader)
	}
	fmt.Fprintf(a.stdout, "pool %s: %d codes read, %d new, %d already known\n", o.pool, rep.Lines, rep.Inserted, rep.Duplicates)
	for _, other := range slices.Sorted(maps.Keys(rep.InOtherPools)) {
		fmt.Fprintf(a.stdout, "  %d of them belong to pool %s (a code is in one pool only; they stay there)\n", rep.InOtherPools[other], other)
	}
	return nil
}

// lineCounter passes r through and reports how many lines have been read so far.
type lineCounter struct {
	r      io.Reader
	lines  int64
	report func(lines int64)
}

func (c *lineCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if k := bytes.Count(p[:n], []byte{'\n'}); k > 0 {
		c.lines += int64(k)
		c.report(c.lines)
	}
	return n, err
}

type codesStatsOptions struct {
	pool   string
	asJSON bool
}

// validate accepts any --pool: a name that is no pool is reported after the lookup, with the pools that
// do exist.
func (o *codesStatsOptions) validate() error { return nil }

// poolStatsView is the stable --json shape of one pool's counts.
type poolStatsView struct {
	Pool     string `json:"pool"`
	Total    int64  `json:"total"`
	Free     int64  `json:"free"`
	Reserved int64  `json:"reserved"`
}

func (a *app) newCodesStatsCmd() *cobra.Command {
	var o codesStatsOptions
	cmd := &cobra.Command{
		Use:   "stats [--pool P] [--json]",
		Short: "Count the codes of every pool (or one): total, free, reserved by a campaign",
		Long: `Count the codes of every pool, empty pools included, or of the pool given with --pool.
Free codes can still be given out; reserved codes belong to a (campaign, recipient).
--json prints an array of {"pool", "total", "free", "reserved"} objects, also with --pool.`,
		Example: `  campaignctl codes stats
  campaignctl codes stats --pool yaz2026 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			pool, err := a.openEngine(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			stats, err := codes.Stats(cmd.Context(), pool)
			if err != nil {
				return err
			}
			views := make([]poolStatsView, 0, len(stats))
			for _, s := range stats {
				if o.pool == "" || s.Pool == o.pool {
					views = append(views, poolStatsView{Pool: s.Pool, Total: s.Total, Free: s.Free, Reserved: s.Reserved})
				}
			}
			if o.pool != "" && len(views) == 0 {
				return unknownPoolError(o.pool, stats)
			}
			if o.asJSON {
				return json.NewEncoder(a.stdout).Encode(views)
			}
			w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "POOL\tTOTAL\tFREE\tRESERVED")
			for _, v := range views {
				fmt.Fprintf(w, "%s\t%d\t%d\t%d\n", v.Pool, v.Total, v.Free, v.Reserved)
			}
			return w.Flush()
		},
	}
	poolVar(cmd.Flags(), &o.pool, "pool", "", "only this pool")
	cmd.Flags().BoolVar(&o.asJSON, "json", false, "print JSON")
	return cmd
}

// maxPoolsNamed is how many existing pools an unknown-pool error lists.
const maxPoolsNamed = 10

func unknownPoolError(name string, stats []codes.PoolStats) error {
	var have string
	switch n := len(stats); {
	case n == 0:
		have = "there are no code pools yet"
	default:
		names := make([]string, 0, min(n, maxPoolsNamed))
		for _, s := range stats[:min(n, maxPoolsNamed)] {
			names = append(names, s.Pool)
		}
		have = "the pools are " + strings.Join(names, ", ")
		if n > maxPoolsNamed {
			have += fmt.Sprintf(" and %d more (campaignctl codes stats lists them all)", n-maxPoolsNamed)
		}
	}
	if !codes.ValidPoolName(name) {
		// No command could create it: none is suggested.
		return usagef("code pool %q does not exist, and no pool can have that name (1 to %d characters of a-z, 0-9, '_' and '-'); %s",
			name, codes.MaxPoolNameLen, have)
	}
	return usagef("code pool %q does not exist; %s. Create it with `campaignctl codes generate --pool %s --count N` or `campaignctl codes import --pool %s FILE`",
		name, have, name, name)
}
