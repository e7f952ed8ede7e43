package client

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"

	"github.com/warrenhq/warren/api"
)

// VerifyRequest is a clean-room check of a sandbox's work: a fresh
// sandbox from a pristine environment gets copies of the named paths and
// runs the command; the agent's sandbox is only read.
type VerifyRequest struct {
	// Image is the verifier's environment ("grader@1").
	Image string
	// Copy are absolute paths in the agent's sandbox, files or
	// directories, each copied to the same path in the verifier.
	Copy []string
	// Exec is the command to run in the verifier.
	Exec api.ExecRequest
	// Resources, Labels and Project go to the verifier's create.
	Resources api.Resources
	Labels    map[string]string
	Project   string
	// Keep leaves the verifier running (VerifyResult.Verifier) instead of
	// deleting it.
	Keep bool
	// Stdout and Stderr, when set, receive the command's output as it
	// streams (it is then not in the result's Stdout and Stderr).
	Stdout, Stderr io.Writer
}

// VerifyResult is the command's result in the verifier, and what the
// copy left out.
type VerifyResult struct {
	api.ExecResult
	Verifier string `json:"verifier"` // the verifier's id (deleted unless Keep)
	// Skipped names what was not copied, with why: symbolic links that
	// lead out of the copied tree (a link to the grader's reference
	// answers would otherwise pass for the agent's), device nodes, FIFOs
	// and sockets (a FIFO would hang the check).
	Skipped []string `json:"skipped,omitempty"`
}

// Verify runs req's command in a clean room: a new sandbox from req.Image
// (never the agent's own binaries, libraries or /etc/passwd) holding only
// copies of req.Copy from sandbox id. Copies go through a filter that
// drops links leading out of each copied tree (others are kept, absolute
// ones inside it made relative) and special files. The agent's sandbox is
// only read; the verifier is deleted when Verify returns unless req.Keep.
func (c *Client) Verify(ctx context.Context, id string, req VerifyRequest) (*VerifyResult, error) {
	if req.Image == "" {
		return nil, errors.New("verify: an image for the verifier is required")
	}
	if len(req.Copy) == 0 {
		return nil, errors.New("verify: name at least one path to copy")
	}
	for _, p := range req.Copy {
		if !path.IsAbs(p) {
			return nil, fmt.Errorf("verify: path %q must be absolute", p)
		}
	}
	v, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Image: req.Image, Resources: req.Resources, Labels: req.Labels, Project: req.Project})
	if err != nil {
		return nil, fmt.Errorf("verify: create the verifier: %w", err)
	}
	res := &VerifyResult{Verifier: v.ID}
	if !req.Keep {
		defer c.DeleteSandbox(context.WithoutCancel(ctx), v.ID)
	}
	for _, p := range req.Copy {
		skipped, err := c.copyBetween(ctx, id, v.ID, path.Clean(p))
		res.Skipped = append(res.Skipped, skipped...)
		if err != nil {
			return res, fmt.Errorf("verify: copy %s: %w", p, err)
		}
	}
	var er *api.ExecResult
	if req.Stdout != nil || req.Stderr != nil {
		stdout, stderr := req.Stdout, req.Stderr
		if stdout == nil {
			stdout = io.Discard
		}
		if stderr == nil {
			stderr = io.Discard
		}
		er, err = c.ExecStream(ctx, v.ID, req.Exec, stdout, stderr)
	} else {
		er, err = c.Exec(ctx, v.ID, req.Exec)
	}
	if err != nil {
		return res, fmt.Errorf("verify: run the check: %w", err)
	}
	res.ExecResult = *er
	return res, nil
}

// copyBetween copies p from sandbox from to the same path in sandbox to,
// through filterTree, and returns what it left out.
func (c *Client) copyBetween(ctx context.Context, from, to, p string) ([]string, error) {
	info, err := c.Stat(ctx, from, p)
	if err != nil {
		return nil, err
	}
	if !info.IsDir {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(c.ReadFile(ctx, from, p, pw)) }()
		mode := os.FileMode(info.Mode) & os.ModePerm
		if mode == 0 {
			mode = 0o644
		}
		err := c.WriteFile(ctx, to, p, mode, pr)
		pr.CloseWithError(errUploadEnded)
		return nil, err
	}
	// The archive of a directory holds it under its base name; the
	// verifier unpacks it into the parent.
	src, srcW := io.Pipe()
	dst, dstW := io.Pipe()
	go func() { srcW.CloseWithError(c.ReadTar(ctx, from, p, srcW)) }()
	var skipped []string
	filterErr := make(chan error, 1)
	go func() {
		err := filterTree(src, dstW, p, func(name, why string) { skipped = append(skipped, name+": "+why) })
		src.CloseWithError(errUploadEnded)
		dstW.CloseWithError(err)
		filterErr <- err
	}()
	parent := path.Dir(p)
	err = c.WriteTar(ctx, to, parent, dst)
	dst.CloseWithError(errUploadEnded)
	if ferr := <-filterErr; ferr != nil && !errors.Is(ferr, errUploadEnded) {
		return skipped, ferr
	}
	return skipped, err
}

// filterTree copies the tar stream of directory remote from r to w,
// leaving out special files and the symbolic links that lead out of the
// tree (judged as CopyFrom's LinksSkip judges them, against every link
// in the archive), and reporting each to skip. Links come last in the
// output, after everything they could point at.
func filterTree(r io.Reader, w io.Writer, remote string, skip func(name, why string)) error {
	mapName := treeNames(remote)
	links := newLinkSet(copyOptions{}, remote)
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	archiveName := map[string]string{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		clean, name, err := entryName(hdr.Name, mapName)
		if err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			skip(clean, "special file")
			continue
		}
		if err := links.take(hdr, name, mapName); err != errNotLink {
			if err != nil {
				return err
			}
			archiveName[name] = clean
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	names := make([]string, 0, len(links.links))
	for n := range links.links {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !links.inside(n) {
			skip(archiveName[n], "symbolic link to "+links.orig[n]+" leads out of the copied tree")
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: archiveName[n], Linkname: links.links[n], Mode: 0o777}); err != nil {
			return err
		}
	}
	return tw.Close()
}
