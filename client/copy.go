package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// CopyTo copies a local file or directory into a sandbox with `docker cp`
// semantics:
//
//   - a file to an existing directory lands inside it under its own name;
//     otherwise it becomes remotePath (a remotePath ending in "/" must be an
//     existing directory);
//   - a directory to an existing directory lands inside it as
//     remotePath/<name>; otherwise it becomes remotePath (created);
//   - localPath ending in "/." (or ".") copies the directory's contents into
//     remotePath (created if missing).
//
// remotePath must be absolute. A symbolic link given as localPath is
// followed; links inside a directory are copied as links.
func (c *Client) CopyTo(ctx context.Context, id, localPath, remotePath string) error {
	if !path.IsAbs(remotePath) {
		return fmt.Errorf("sandbox path %q must be absolute", remotePath)
	}
	contents := localPath == "." || strings.HasSuffix(localPath, string(filepath.Separator)+".")
	wantDir := strings.HasSuffix(remotePath, "/")
	remote := path.Clean(remotePath)

	info, err := os.Stat(localPath)
	if err != nil {
		return err
	}
	rinfo, err := c.Stat(ctx, id, remote)
	exists := err == nil
	if err != nil && !IsFileNotFound(err) {
		return err
	}

	switch {
	case info.Mode().IsRegular():
		target := remote
		switch {
		case exists && rinfo.IsDir:
			target = path.Join(remote, filepath.Base(localPath))
		case !exists && wantDir:
			return fmt.Errorf("destination directory %s does not exist in the sandbox", remotePath)
		}
		f, err := os.Open(localPath)
		if err != nil {
			return err
		}
		defer f.Close()
		return c.WriteFile(ctx, id, target, info.Mode().Perm(), f)

	case info.IsDir():
		if exists && !rinfo.IsDir {
			return fmt.Errorf("cannot copy directory %s onto file %s", localPath, remote)
		}
		target := remote
		if exists && !contents {
			abs, err := filepath.Abs(localPath)
			if err != nil {
				return err
			}
			target = path.Join(remote, filepath.Base(abs))
		}
		return c.uploadDir(ctx, id, localPath, target)
	}
	return fmt.Errorf("%s: cannot copy a %s", localPath, fileKind(info.Mode()))
}

// uploadDir streams dir as a tar to target without buffering it.
func (c *Client) uploadDir(ctx context.Context, id, dir, target string) error {
	pr, pw := io.Pipe()
	packErr := make(chan error, 1)
	go func() {
		err := PackDir(pw, dir)
		pw.CloseWithError(err)
		packErr <- err
	}()
	err := c.WriteTar(ctx, id, target, pr)
	pr.CloseWithError(errUploadEnded) // unblock the packer if the upload stopped early
	if perr := <-packErr; perr != nil && !errors.Is(perr, errUploadEnded) {
		return perr // the root cause; the upload only saw a cut stream
	}
	return err
}

var errUploadEnded = errors.New("upload ended")

// CopyFrom copies a file or directory out of a sandbox with `docker cp`
// semantics, mirroring CopyTo:
//
//   - a file to an existing local directory lands inside it under its own
//     name; otherwise it becomes localPath (replaced atomically);
//   - a directory to an existing local directory lands inside it as
//     localPath/<name>; otherwise it becomes localPath (its parent must
//     exist);
//   - remotePath ending in "/." copies the directory's contents into
//     localPath (created if missing).
//
// The archive comes from the sandbox and is treated as hostile: it is
// unpacked with ExtractTar's guarantees, confined to the destination
// directory, and only entries under remotePath's name are accepted.
// Symbolic links that would lead out of the copied tree (to the local
// machine's files) are skipped unless WithLinks says otherwise; see
// LinkPolicy.
func (c *Client) CopyFrom(ctx context.Context, id, remotePath, localPath string, opts ...CopyOption) error {
	var o copyOptions
	for _, opt := range opts {
		opt(&o)
	}
	if !path.IsAbs(remotePath) {
		return fmt.Errorf("sandbox path %q must be absolute", remotePath)
	}
	contents := strings.HasSuffix(remotePath, "/.")
	remote := path.Clean(remotePath)
	wantDir := strings.HasSuffix(localPath, string(filepath.Separator))

	rinfo, err := c.Stat(ctx, id, remote)
	if err != nil {
		return err
	}
	linfo, err := os.Stat(localPath)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}

	if !rinfo.IsDir {
		if contents {
			return fmt.Errorf("%s is not a directory in the sandbox", remote)
		}
		dest := localPath
		switch {
		case exists && linfo.IsDir():
			dest = filepath.Join(localPath, path.Base(remote))
		case !exists && wantDir:
			return fmt.Errorf("destination directory %s does not exist", localPath)
		}
		return c.downloadFile(ctx, id, remote, dest, fs.FileMode(rinfo.Mode)&fs.ModePerm)
	}

	if exists && !linfo.IsDir() {
		return fmt.Errorf("cannot copy directory %s onto file %s", remote, localPath)
	}
	dest := localPath
	if exists && !contents && remote != "/" {
		dest = filepath.Join(localPath, path.Base(remote))
	}
	created := false
	if err := os.Mkdir(dest, 0o755); err == nil {
		created = true
	} else if fi, serr := os.Stat(dest); serr != nil || !fi.IsDir() {
		return err
	}
	root, err := os.OpenRoot(dest)
	if err != nil {
		return err
	}
	defer root.Close()

	mapName := treeNames(remote)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	readErr := make(chan error, 1)
	go func() {
		err := c.ReadTar(ctx, id, remote, pw)
		pw.CloseWithError(err)
		readErr <- err
	}()
	links := newLinkSet(o, remote)
	xerr := extract(root, pr, mapName, created, links)
	if xerr == nil {
		_, _ = io.Copy(io.Discard, pr) // let the download finish the archive's padding
	} else {
		cancel()
		pr.CloseWithError(xerr)
	}
	rerr := <-readErr
	switch {
	case rerr != nil && (xerr == nil || errors.Is(xerr, rerr) || isAPIError(rerr)):
		return rerr
	case xerr != nil:
		return fmt.Errorf("extract %s into %s: %w", remote, dest, xerr)
	}
	return nil
}

// treeNames maps the entry names of a sandbox's archive of directory
// remote (which holds it under its base name) to names relative to the
// tree's top ("." for the top itself), refusing anything else.
func treeNames(remote string) func(string) (string, error) {
	top := path.Base(remote)
	return func(name string) (string, error) {
		if remote == "/" {
			return name, nil
		}
		if name == top {
			return ".", nil
		}
		if rest, ok := strings.CutPrefix(name, top+"/"); ok {
			return rest, nil
		}
		return "", refuse(name, "not under %q", top)
	}
}

// downloadFile writes a sandbox file to dest through a temporary file in the
// same directory, so dest is replaced whole or not at all.
func (c *Client) downloadFile(ctx context.Context, id, remote, dest string, perm fs.FileMode) error {
	dir := filepath.Dir(dest)
	tmp, err := os.CreateTemp(dir, ".warren-cp-*")
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := c.ReadFile(ctx, id, remote, tmp); err != nil {
		return err
	}
	if perm == 0 {
		perm = 0o644
	}
	if err := tmp.Chmod(perm); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if fi, err := os.Lstat(dest); err == nil && fi.IsDir() {
		return fmt.Errorf("cannot copy file %s onto directory %s", remote, dest)
	}
	if err := os.Rename(tmp.Name(), dest); err != nil {
		return err
	}
	ok = true
	return nil
}
