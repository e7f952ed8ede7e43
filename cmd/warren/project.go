package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/client"
)

// projectCommands returns the top-level `project` and `token` verbs.
func projectCommands(a *app) []*cobra.Command {
	project := &cobra.Command{Use: "project", Aliases: []string{"projects", "proj"},
		Short: "Create projects, hand them quotas, show their usage"}
	groupArgs(project)
	project.AddCommand(newProjectCreateCmd(a), newProjectLsCmd(a), newProjectGetCmd(a), newProjectUpdateCmd(a), newProjectRmCmd(a),
		newProjectPauseCmd(a, false), newProjectPauseCmd(a, true))

	token := &cobra.Command{Use: "token", Aliases: []string{"tokens"}, Short: "Mint, list and revoke API tokens"}
	groupArgs(token)
	token.AddCommand(newTokenCreateCmd(a), newTokenLsCmd(a), newTokenRevokeCmd(a))
	return []*cobra.Command{project, token}
}

const quotaHelp = `QUOTA is a comma-separated list of KEY=VALUE: sandboxes=N, vcpu=CORES,
memory=SIZE, disk=SIZE (sizes like 512Gi or 2Ti), creates=N[/s] (sandbox
creations per second), burst=N (that rate limit's bucket), fn=N[/s]
(FnCalls per second, each call of a batch counting) and fn-burst=N. 0
removes a limit. A sub-project's quota is carved out of its parent's: the quotas of a
project's sub-projects add up to at most its own.`

// parseQuota reads "sandboxes=2000,vcpu=500,memory=2Ti,creates=50/s".
func parseQuota(s string) (api.QuotaPatch, error) {
	var p api.QuotaPatch
	if strings.TrimSpace(s) == "" {
		return p, usagef("--quota: empty (want e.g. sandboxes=2000,vcpu=500,memory=2Ti)")
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		k, v = strings.ToLower(strings.TrimSpace(k)), strings.TrimSpace(v)
		if !ok || v == "" {
			return p, usagef("--quota: %q: want KEY=VALUE", kv)
		}
		bad := func(want string) error { return usagef("--quota: %s=%s: want %s", k, v, want) }
		switch k {
		case "sandboxes":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return p, bad("a count")
			}
			p.Sandboxes = &n
		case "vcpu", "cpu":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f < 0 {
				return p, bad("a number of cores")
			}
			p.CPU = &f
		case "memory", "mem", "disk":
			q, err := api.ParseQuantity(v)
			if err != nil {
				return p, bad("a size like 2Ti")
			}
			if k == "disk" {
				p.Disk = &q
			} else {
				p.Memory = &q
			}
		case "creates", "creates/s", "rate", "fn", "fn/s", "fn-calls":
			f, err := strconv.ParseFloat(strings.TrimSuffix(v, "/s"), 64)
			if err != nil || f < 0 {
				return p, bad("a number per second, like 50/s")
			}
			if strings.HasPrefix(k, "fn") {
				p.FnCallsPerSec = &f
			} else {
				p.CreatesPerSec = &f
			}
		case "burst", "creates-burst", "fn-burst":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return p, bad("a count")
			}
			if k == "fn-burst" {
				p.FnCallsBurst = &n
			} else {
				p.CreatesBurst = &n
			}
		default:
			return p, usagef("--quota: unknown key %q (want sandboxes, vcpu, memory, disk, creates, burst, fn or fn-burst)", k)
		}
	}
	return p, nil
}

// displayPath shows the root project as "/".
func displayPath(p string) string {
	if p == "" {
		return "/"
	}
	return p
}

// memoryMergeHelp says what --memory-merge does.
const memoryMergeHelp = `--memory-merge lets nodes merge equal memory pages (KSM) among the
project's sandboxes and its sub-projects' (not gVisor's), and only among
them: many sandboxes of one environment hold the same pages. Merged pages
leak by write timing to whatever shares them, so use it within one
tenant only; a node runs one merging project's sandboxes at a time.`

func newProjectCreateCmd(a *app) *cobra.Command {
	var quota, desc string
	var merge bool
	c := showCmd(a, &cobra.Command{
		Use:   "create PATH [--quota QUOTA] [--description TEXT] [--memory-merge]",
		Short: "Create a sub-project with part of its parent's quota",
		Long: `Create the project PATH (segments of a-z, 0-9, '.', '_', '-', joined by '/').
Its parent must exist; the token must be an admin of a proper ancestor.

` + quotaHelp + "\n\n" + memoryMergeHelp,
		Example: `  warren project create research --quota sandboxes=5000,vcpu=1000,memory=4Ti,creates=100/s
  warren project create research/rl-math --quota sandboxes=2000,vcpu=500,memory=2Ti --memory-merge`,
		Args: exactArgs(1, "one project path"),
	}, "text", func(cmd *cobra.Command, args []string) (*api.Project, error) {
		req := api.CreateProjectRequest{Path: args[0], Description: desc, MemoryMerge: merge}
		if quota != "" {
			p, err := parseQuota(quota)
			if err != nil {
				return nil, err
			}
			req.Quota = p.Apply(api.Quota{})
		}
		return a.client().CreateProject(cmd.Context(), req)
	}, printProject)
	f := c.Flags()
	f.StringVar(&quota, "quota", "", "QUOTA, e.g. sandboxes=2000,vcpu=500,memory=2Ti,creates=50/s (default: none of its own)")
	f.StringVar(&desc, "description", "", "what the project is for")
	f.BoolVar(&merge, "memory-merge", false, "merge equal memory pages (KSM) among the project's sandboxes")
	return c
}

func newProjectUpdateCmd(a *app) *cobra.Command {
	var quota, desc string
	var merge bool
	c := showCmd(a, &cobra.Command{
		Use:   "update PATH [--quota QUOTA] [--description TEXT] [--memory-merge[=false]]",
		Short: "Change some of a project's quota, its description or memory merging",
		Long: `Change the quota fields given in --quota and keep the others (0 removes
a limit), and/or the description. A quota may drop below current usage
(creates then wait until usage drains), never below what the project has
handed down to its sub-projects. Memory merging applies to sandboxes
created after the change.

` + quotaHelp + "\n\n" + memoryMergeHelp,
		Example: `  warren project update research/rl-math --quota vcpu=600,creates=0
  warren project update research/rl-math --memory-merge=false`,
		Args: exactArgs(1, "one project path"),
	}, "text", func(cmd *cobra.Command, args []string) (*api.Project, error) {
		var req api.UpdateProjectRequest
		if cmd.Flags().Changed("quota") {
			p, err := parseQuota(quota)
			if err != nil {
				return nil, err
			}
			req.Quota = &p
		}
		if cmd.Flags().Changed("description") {
			req.Description = &desc
		}
		if cmd.Flags().Changed("memory-merge") {
			req.MemoryMerge = &merge
		}
		if req.Quota == nil && req.Description == nil && req.MemoryMerge == nil {
			return nil, usagef("nothing to change: give --quota, --description or --memory-merge")
		}
		return a.client().UpdateProject(cmd.Context(), args[0], req)
	}, printProject)
	f := c.Flags()
	f.StringVar(&quota, "quota", "", "QUOTA fields to change, e.g. vcpu=600,memory=3Ti")
	f.StringVar(&desc, "description", "", "new description")
	f.BoolVar(&merge, "memory-merge", false, "merge equal memory pages (KSM) among the project's sandboxes (=false: stop)")
	return c
}

func newProjectGetCmd(a *app) *cobra.Command {
	return showCmd(a, &cobra.Command{
		Use:     "get PATH",
		Aliases: []string{"inspect"},
		Short:   "Show a project's quota, usage and sub-projects",
		Args:    exactArgs(1, "one project path (/ for the root)"),
	}, "text", func(cmd *cobra.Command, args []string) (*api.Project, error) {
		return a.client().GetProject(cmd.Context(), args[0])
	}, printProject)
}

// usedOf renders "used / limit", or "used" alone when there is no limit.
func usedOf(used, limit string, limited bool) string {
	if !limited {
		return used
	}
	return used + " / " + limit
}

func printProject(w io.Writer, p *api.Project) error {
	now := time.Now()
	q, u := p.Quota, p.Usage
	tw := newTable(w, "Project:", displayPath(p.Path))
	if p.Description != "" {
		row(tw, "Description:", p.Description)
	}
	row(tw, "", "USED / QUOTA")
	row(tw, "Sandboxes:", usedOf(fmt.Sprint(u.Sandboxes), fmt.Sprint(q.Sandboxes), q.Sandboxes > 0))
	row(tw, "vCPU:", usedOf(fmtCores(u.CPU), fmtCores(q.CPU), q.CPU > 0))
	row(tw, "Memory:", usedOf(u.Memory.String(), q.Memory.String(), q.Memory > 0))
	row(tw, "Disk:", usedOf(u.Disk.String(), q.Disk.String(), q.Disk > 0))
	row(tw, "Creates/s:", fmtRate(q.CreatesPerSec, q.CreatesBurst))
	row(tw, "FnCalls/s:", fmtRate(q.FnCallsPerSec, q.FnCallsBurst))
	if p.MemoryMerge {
		row(tw, "Memory merge:", "on (KSM, among this project's sandboxes)")
	}
	if r := p.Reserved; r.Sandboxes > 0 {
		row(tw, "Being created:", fmt.Sprintf("%d sandboxes, %s vCPU, %s", r.Sandboxes, fmtCores(r.CPU), r.Memory))
	}
	children := make([]string, len(p.Children))
	for i, c := range p.Children {
		children[i] = strings.TrimPrefix(c, p.Path+"/")
	}
	row(tw, "Sub-projects:", orDash(strings.Join(children, ", ")))
	row(tw, "Created:", stamp(p.CreatedAt, now))
	if !p.UpdatedAt.Equal(p.CreatedAt) {
		row(tw, "Updated:", stamp(p.UpdatedAt, now))
	}
	return tw.Flush()
}

func fmtCores(c float64) string { return strconv.FormatFloat(c, 'f', -1, 64) }

func fmtRate(perSec float64, burst int64) string {
	if perSec <= 0 {
		return "-"
	}
	s := fmtCores(perSec) + "/s"
	if burst > 0 {
		s += fmt.Sprintf(" (burst %d)", burst)
	}
	return s
}

func newProjectLsCmd(a *app) *cobra.Command {
	return showCmd(a, &cobra.Command{
		Use:     "ls [PATH]",
		Aliases: []string{"list", "tree"},
		Short:   "Show a project tree with quotas and usage (default: the token's own project)",
		Long: `Show PATH and every project under it as a tree. Usage counts the whole
subtree; "used / quota" where the project sets a limit of its own.`,
		Args: maxArgs(1, "at most one project path (/ for the root)"),
	}, "tree", func(cmd *cobra.Command, args []string) (api.ProjectList, error) {
		list, err := a.client().ListProjects(cmd.Context(), firstArg(args))
		return api.ProjectList{Projects: nonNil(list)}, err
	}, func(w io.Writer, list api.ProjectList) error {
		return printProjectTree(w, list.Projects)
	})
}

// printProjectTree draws list (a subtree sorted by path, its top first)
// with box-drawing branches.
func printProjectTree(w io.Writer, list []api.Project) error {
	if len(list) == 0 {
		return nil
	}
	byPath := make(map[string]api.Project, len(list))
	for _, p := range list {
		byPath[p.Path] = p
	}
	tw := newTable(w, "PROJECT", "SANDBOXES", "VCPU", "MEMORY", "DISK", "CREATES/S", "FN/S", "DESCRIPTION")
	var walk func(p api.Project, label, indent string)
	walk = func(p api.Project, label, indent string) {
		q, u := p.Quota, p.Usage
		row(tw, label,
			usedOf(fmt.Sprint(u.Sandboxes), fmt.Sprint(q.Sandboxes), q.Sandboxes > 0),
			usedOf(fmtCores(u.CPU), fmtCores(q.CPU), q.CPU > 0),
			usedOf(u.Memory.String(), q.Memory.String(), q.Memory > 0),
			usedOf(u.Disk.String(), q.Disk.String(), q.Disk > 0),
			fmtRate(q.CreatesPerSec, q.CreatesBurst), fmtRate(q.FnCallsPerSec, q.FnCallsBurst), orDash(p.Description))
		for i, c := range p.Children {
			child, ok := byPath[c]
			if !ok {
				continue
			}
			branch, next := "├── ", "│   "
			if i == len(p.Children)-1 {
				branch, next = "└── ", "    "
			}
			name := c[strings.LastIndexByte(c, '/')+1:]
			walk(child, indent+branch+name, indent+next)
		}
	}
	walk(list[0], displayPath(list[0].Path), "")
	return tw.Flush()
}

func newProjectRmCmd(a *app) *cobra.Command {
	return eachCmd(a, &cobra.Command{
		Use:     "rm PATH [PATH...]",
		Aliases: []string{"delete", "remove"},
		Short:   "Delete projects without sub-projects or sandboxes (their tokens stop working)",
	}, "one or more project paths", (*client.Client).DeleteProject)
}

// parseTTL reads a Go duration or a number of days ("30d").
func parseTTL(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		f, err := strconv.ParseFloat(d, 64)
		if err != nil || f < 0 {
			return 0, usagef("--ttl %q: want e.g. 30d, 12h or 90m", s)
		}
		return time.Duration(f * float64(24*time.Hour)), nil
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return 0, usagef("--ttl %q: want e.g. 30d, 12h or 90m", s)
	}
	return v, nil
}

func newTokenCreateCmd(a *app) *cobra.Command {
	var (
		req api.CreateTokenRequest
		ttl string
	)
	c := showCmd(a, &cobra.Command{
		Use:   "create --project PATH --role ROLE [--ttl 30d] [--name NAME]",
		Short: "Mint a token and print its secret (shown this once)",
		Long: `Mint a token scoped to PATH's subtree and print its secret on stdout; the
server keeps only its hash. Roles: reader (read), runner (+ sandboxes),
builder (+ layers and environments), admin (+ sub-projects and tokens),
node (a node agent joining; root admins only). A token never outranks or
outlives the one that mints it.`,
		Example: `  warren token create --project research/rl-math --role runner --ttl 30d --name trainer-7
  export WARREN_TOKEN=$(warren token create --project research/rl-math --role admin --ttl 7d)
  warren token create --role node --node rack2-node7 > rack2-node7.token`,
		Args: noArgs,
	}, "secret", func(cmd *cobra.Command, args []string) (*api.CreatedToken, error) {
		if req.Role == "" {
			return nil, usagef("--role is required (reader, runner, builder, admin or node)")
		}
		if req.Node != "" && req.Role != api.RoleNode {
			return nil, usagef("--node binds a node token: it needs --role node")
		}
		if ttl != "" {
			d, err := parseTTL(ttl)
			if err != nil {
				return nil, err
			}
			req.TTL = api.Duration(d)
		}
		return a.client().CreateToken(cmd.Context(), req)
	}, func(w io.Writer, t *api.CreatedToken) error {
		fmt.Fprintln(w, t.Secret)
		exp := "never expires"
		if !t.Token.ExpiresAt.IsZero() {
			exp = "expires " + t.Token.ExpiresAt.Local().Format(time.RFC3339)
		}
		bound := ""
		if t.Token.Node != "" {
			bound = ", bound to node " + t.Token.Node
		}
		fmt.Fprintf(a.stderr, "token %s: %s of %s%s, %s. The secret above is shown only once.\n",
			t.Token.ID, t.Token.Role, displayPath(t.Token.Project), bound, exp)
		return nil
	})
	f := c.Flags()
	f.StringVar(&req.Project, "project", "", "project whose subtree the token acts on (default: the creating token's own)")
	f.StringVar(&req.Role, "role", "", "reader, runner, builder, admin or node (required)")
	f.StringVar(&ttl, "ttl", "", "lifetime, e.g. 30d or 12h (default: the creating token's own)")
	f.StringVar(&req.Name, "name", "", "a name to recognise it by, e.g. trainer-7")
	f.StringVar(&req.Description, "description", "", "what it is for")
	f.StringVar(&req.Node, "node", "", "bind a node token to this node name: an agent holding it registers only as that name")
	return c
}

func newTokenLsCmd(a *app) *cobra.Command {
	var project string
	c := showCmd(a, &cobra.Command{
		Use:     "ls [--project PATH]",
		Aliases: []string{"list"},
		Short:   "List the tokens of a project's subtree (default: the token's own project)",
		Args:    noArgs,
	}, "table", func(cmd *cobra.Command, args []string) (api.TokenList, error) {
		list, err := a.client().ListTokens(cmd.Context(), project)
		return api.TokenList{Tokens: nonNil(list)}, err
	}, func(w io.Writer, list api.TokenList) error {
		now := time.Now()
		tw := newTable(w, "ID", "NAME", "PROJECT", "ROLE", "NODE", "EXPIRES", "CREATED")
		for _, t := range list.Tokens {
			exp := "never"
			switch {
			case t.ExpiresAt.IsZero():
			case !t.ExpiresAt.After(now):
				exp = "expired"
			default:
				exp = "in " + age(now, t.ExpiresAt) // age measures ExpiresAt - now here
			}
			row(tw, t.ID, orDash(t.Name), displayPath(t.Project), t.Role, orDash(t.Node), exp, age(t.CreatedAt, now))
		}
		return tw.Flush()
	})
	c.Flags().StringVar(&project, "project", "", "project whose subtree to list (/ for the root)")
	return c
}

func newTokenRevokeCmd(a *app) *cobra.Command {
	return eachCmd(a, &cobra.Command{
		Use:     "revoke ID [ID...]",
		Aliases: []string{"rm", "delete"},
		Short:   "Revoke tokens (they stop working within seconds on every apiserver)",
	}, "one or more token ids", (*client.Client).RevokeToken)
}
