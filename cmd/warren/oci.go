package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/client"
)

// imageCommands returns the `image` subcommands beyond ls (import, ...).
func imageCommands(a *app) []*cobra.Command {
	return []*cobra.Command{newImageImportCmd(a), newExportCmd(a, "export")}
}

func newImageImportCmd(a *app) *cobra.Command {
	var (
		name, ref, output string
		quiet             bool
	)
	c := &cobra.Command{
		Use:   "import docker-archive:FILE|oci-layout:DIR|qcow2:FILE --name NAME[@VERSION]",
		Short: "Import an OCI image as an environment",
		Long: `Import an image from a docker-archive tarball (docker save, skopeo copy
docker-archive:) or an OCI image layout directory. The server flattens the
image's layers into one base layer NAME@VERSION, applying whiteouts and
keeping modes, owners, links and xattrs, and creates the environment
NAME@VERSION with the image's env, working directory, user and entrypoint
(+cmd). Without @VERSION the image's tag is the version, or else the first
12 hex digits of its ID. Images with device nodes or paths escaping the root
are refused. A plain path is taken as a layout if it is a directory and as a
docker-archive otherwise.

qcow2:FILE imports a whole disk image for the vm backend: one layer of kind
disk (version 1 unless given), booted by its firmware with
'sandbox create --backend vm --disk-image NAME@VERSION'. An image with a
backing file or an external data file is refused.`,
		Example: `  warren image import docker-archive:./app.tar --name app
  warren image import oci-layout:./app-layout --name app@2 --ref 2.0
  warren image import qcow2:./desktop.qcow2 --name desktop`,
		Args: exactArgs(1, "one source, docker-archive:FILE or oci-layout:DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output, outDefault, outJSON); err != nil {
				return err
			}
			if name == "" {
				return usagef("--name is required")
			}
			format, path, err := parseImageSource(args[0])
			if err != nil {
				return err
			}
			var total int64
			if format == client.FormatOCILayout {
				total, err = client.LayoutSize(path)
			} else {
				var fi os.FileInfo
				if fi, err = os.Stat(path); err == nil {
					total = fi.Size()
				}
			}
			if err != nil {
				return fmt.Errorf("image source: %w", err)
			}
			bar := newProgressBar(a.stderr, "uploading", total, quiet)
			start := time.Now()
			env, err := a.client().ImportImageFromPath(cmd.Context(), format, path, name, client.ImportOptions{
				Ref:      ref,
				Progress: bar.update,
			})
			bar.finish(err == nil)
			if err != nil {
				return err
			}
			if !quiet {
				fmt.Fprintf(a.stderr, "imported %s in %s\n", env.Ref, time.Since(start).Round(time.Millisecond))
			}
			return a.printEnv(env, output)
		},
	}
	f := c.Flags()
	f.StringVar(&name, "name", "", "environment (and base layer) to create: NAME or NAME@VERSION (required)")
	f.StringVar(&ref, "ref", "", "which image of an archive holding several: a tag (app:1.0) or a layout ref.name")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress on stderr")
	f.StringVarP(&output, "output", "o", "", "output: text (default) or json")
	return c
}

// parseImageSource splits TRANSPORT:PATH; a bare path is a layout if it is
// a directory, a docker-archive otherwise.
func parseImageSource(src string) (format, path string, err error) {
	for _, f := range []string{client.FormatDockerArchive, client.FormatOCILayout, client.FormatQCOW2} {
		if p, ok := strings.CutPrefix(src, f+":"); ok {
			if p == "" {
				return "", "", usagef("%s: empty path", src)
			}
			return f, p, nil
		}
	}
	if t, _, ok := strings.Cut(src, ":"); ok && !strings.ContainsAny(t, "/.") {
		return "", "", usagef("unknown image source %q: want docker-archive:FILE, oci-layout:DIR or qcow2:FILE", src)
	}
	fi, err := os.Stat(src)
	if err != nil {
		return "", "", fmt.Errorf("image source: %w", err)
	}
	if fi.IsDir() {
		return client.FormatOCILayout, src, nil
	}
	return client.FormatDockerArchive, src, nil
}

// newExportCmd is `warren env export` and its alias `warren image export`:
// call it once per parent, a cobra command has one.
func newExportCmd(a *app, use string) *cobra.Command {
	var (
		format string
		quiet  bool
	)
	c := &cobra.Command{
		Use:   use + " NAME@VERSION --format oci-layout DIR",
		Short: "Export an environment as an OCI image layout",
		Long: `Export an environment as an OCI image layout in DIR (created; must be empty
if it exists): one gzip layer per warren layer, bottom first, overlay
whiteouts turned into OCI ones, and an image config with the environment's
env, working directory, user and entrypoint. The image is named by the
environment's version in the layout's index, so skopeo and others find it
as oci:DIR or oci:DIR:VERSION.`,
		Example: `  warren env export swe-task-0042@1 --format oci-layout ./out
  skopeo inspect oci:./out`,
		Args: exactArgs(2, "NAME@VERSION and a directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != client.FormatOCILayout {
				return usagef("--format %q: only %s is supported", format, client.FormatOCILayout)
			}
			bar := newProgressBar(a.stderr, "downloading", 0, quiet)
			err := a.client().ExportEnvToDir(cmd.Context(), args[0], args[1], bar.update)
			bar.finish(err == nil)
			if err != nil {
				return err
			}
			fmt.Fprintln(a.stdout, args[1])
			return nil
		},
	}
	c.Flags().StringVar(&format, "format", client.FormatOCILayout, "output format: oci-layout")
	c.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress on stderr")
	return c
}

// newEnvExportCmd is `warren env export`, for the env command group
// (registered by layerCommands).
func newEnvExportCmd(a *app) *cobra.Command { return newExportCmd(a, "export") }

// progressBar draws transfer progress on a terminal:
//
//	uploading [=========>          ]  48%  120.3MiB / 250.0MiB  41.2MiB/s
//
// On anything else it stays silent until finish, which prints one summary
// line, so logs and pipes get no carriage-return noise.
type progressBar struct {
	w     io.Writer
	label string
	total int64 // 0: unknown, no bar
	tty   bool
	quiet bool
	start time.Time

	mu    sync.Mutex
	n     int64
	drawn time.Time
}

func newProgressBar(w io.Writer, label string, total int64, quiet bool) *progressBar {
	return &progressBar{w: w, label: label, total: total, tty: isTerminal(w), quiet: quiet, start: time.Now()}
}

// update records n bytes done; it may be called from any goroutine.
func (p *progressBar) update(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n = n
	if p.quiet || !p.tty || time.Since(p.drawn) < 100*time.Millisecond {
		return
	}
	p.drawn = time.Now()
	fmt.Fprintf(p.w, "\r%s\x1b[K", p.line())
}

// finish ends the bar: on success a final line with the totals.
func (p *progressBar) finish(ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.quiet {
		return
	}
	switch {
	case p.tty && !p.drawn.IsZero():
		if ok && p.total > 0 {
			p.n = max(p.n, p.total)
		}
		fmt.Fprintf(p.w, "\r%s\x1b[K\n", p.line())
	case ok && p.n > 0:
		fmt.Fprintf(p.w, "%s %s done\n", p.label, fmtBytes(p.n))
	}
}

func (p *progressBar) line() string {
	rate := ""
	if s := time.Since(p.start).Seconds(); s > 0.2 {
		rate = "  " + fmtBytes(int64(float64(p.n)/s)) + "/s"
	}
	if p.total <= 0 {
		return fmt.Sprintf("%s %s%s", p.label, fmtBytes(p.n), rate)
	}
	const width = 30
	frac := min(float64(p.n)/float64(p.total), 1)
	fill := int(frac * width)
	bar := strings.Repeat("=", fill)
	if fill < width {
		bar += ">" + strings.Repeat(" ", width-fill-1)
	}
	return fmt.Sprintf("%s [%s] %3.0f%%  %s / %s%s", p.label, bar, frac*100, fmtBytes(p.n), fmtBytes(p.total), rate)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
