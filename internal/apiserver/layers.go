package apiserver

import (
	"context"
	"io"
	"net/http"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/node"
)

// Layers is what the layer and environment routes need; *image.Registry
// satisfies it. live maps layer digests to the live sandboxes using them.
type Layers interface {
	BuildLayerFromTar(ctx context.Context, spec image.LayerSpec, tarball io.Reader) (api.Layer, error)
	ListLayers(ctx context.Context) ([]api.Layer, error)
	DescribeLayer(ctx context.Context, ref string) (api.Layer, error)
	DeleteLayer(ctx context.Context, ref string, live map[string][]string) error
	CreateEnv(ctx context.Context, req api.CreateEnvironmentRequest) (api.Environment, error)
	ListEnvs(ctx context.Context) ([]api.Environment, error)
	GetEnv(ctx context.Context, ref string) (api.Environment, error)
	DeleteEnv(ctx context.Context, ref string) error
	GC(ctx context.Context, live map[string][]string) (api.GCResult, error)
}

// layerRoutes registers /v1/layers, /v1/environments and /v1/gc.
func (s *Server) layerRoutes(auth func(handler) http.Handler) {
	s.mux.Handle("POST /v1/layers", auth(s.changesImages(s.buildLayer)))
	s.mux.Handle("GET /v1/layers", auth(s.listLayers))
	s.mux.Handle("GET /v1/layers/{ref...}", auth(s.getLayer))
	s.mux.Handle("DELETE /v1/layers/{ref...}", auth(s.changesImages(s.deleteLayer)))
	s.mux.Handle("POST /v1/environments", auth(s.changesImages(s.createEnv)))
	s.mux.Handle("POST /v1/environments/{ref...}", auth(s.changesImages(s.envVerb)))
	s.mux.Handle("GET /v1/environments", auth(s.listEnvs))
	s.mux.Handle("GET /v1/environments/{ref...}", auth(s.getEnv))
	s.mux.Handle("DELETE /v1/environments/{ref...}", auth(s.changesImages(s.deleteEnv)))
	s.mux.Handle("POST /v1/gc", auth(s.changesImages(s.gc)))
}

// imageCacher is a Cluster that keeps resolved images for a moment
// (Router).
type imageCacher interface{ ImagesChanged() }

// changesImages wraps a handler that may change layers or environments:
// afterwards the cluster forgets the images it resolved, so that this
// apiserver's next creates see the change.
func (s *Server) changesImages(h handler) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		err := h(w, r)
		if c, ok := s.cluster.(imageCacher); ok {
			c.ImagesChanged()
		}
		return err
	}
}

func (s *Server) layers() (Layers, error) {
	if s.cfg.Layers == nil {
		return nil, errdefs.Unavailable("this server keeps no layers")
	}
	return s.cfg.Layers, nil
}

// liveLayers asks the nodes which layers their sandboxes use, in any
// state: a failed sandbox still holds its layers until deleted.
func (s *Server) liveLayers(ctx context.Context) (map[string][]string, error) {
	if lu, ok := s.cluster.(LayerUser); ok {
		return lu.LiveLayers(ctx)
	}
	list, err := s.cluster.List(ctx, node.Filter{})
	if err != nil {
		return nil, err
	}
	live := map[string][]string{}
	for _, sb := range list {
		for _, d := range sb.Layers {
			live[d] = append(live[d], sb.ID)
		}
	}
	return live, nil
}

// collectSoon asks for a GC after a delete, if the daemon wired one.
func (s *Server) collectSoon() {
	if s.cfg.CollectGarbage != nil {
		s.cfg.CollectGarbage()
	}
}

// buildLayer builds a layer from a tar or tar.gz body (told apart by its
// first bytes); name, version, kind and parent come in the query.
func (s *Server) buildLayer(w http.ResponseWriter, r *http.Request) error {
	ls, err := s.layers()
	if err != nil {
		return err
	}
	q := r.URL.Query()
	spec := image.LayerSpec{Name: q.Get("name"), Version: q.Get("version"), Kind: q.Get("kind"), Parent: q.Get("parent")}
	if spec.Name == "" || spec.Version == "" || spec.Kind == "" {
		return errdefs.Invalid("name, version and kind are required query parameters")
	}
	if ct := mediaTypeOf(r); ct == "application/json" || strings.HasPrefix(ct, "multipart/") {
		return errdefs.Invalid("Content-Type %s: the body is the layer's files as a tar or tar.gz stream", ct)
	}
	l, err := ls.BuildLayerFromTar(r.Context(), spec, r.Body)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/layers/"+l.Ref)
	return writeJSON(w, http.StatusCreated, l)
}

func (s *Server) listLayers(w http.ResponseWriter, r *http.Request) error {
	ls, err := s.layers()
	if err != nil {
		return err
	}
	list, err := ls.ListLayers(r.Context())
	if err != nil {
		return err
	}
	list = named(list, r.URL.Query().Get("name"), func(l api.Layer) string { return l.Name })
	return writeJSON(w, http.StatusOK, api.LayerList{Layers: list})
}

func (s *Server) getLayer(w http.ResponseWriter, r *http.Request) error {
	ls, err := s.layers()
	if err != nil {
		return err
	}
	l, err := ls.DescribeLayer(r.Context(), r.PathValue("ref"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, l)
}

func (s *Server) deleteLayer(w http.ResponseWriter, r *http.Request) error {
	ls, err := s.layers()
	if err != nil {
		return err
	}
	live, err := s.liveLayers(r.Context())
	if err != nil {
		return err
	}
	if err := ls.DeleteLayer(r.Context(), r.PathValue("ref"), live); err != nil {
		return err
	}
	s.collectSoon()
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) createEnv(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateEnvironmentRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := api.CheckEnvironment(&req); err != nil {
		return errdefs.Request(err)
	}
	ls, err := s.layers()
	if err != nil {
		return err
	}
	env, err := ls.CreateEnv(r.Context(), req)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/environments/"+env.Ref)
	return writeJSON(w, http.StatusCreated, env)
}

func (s *Server) listEnvs(w http.ResponseWriter, r *http.Request) error {
	ls, err := s.layers()
	if err != nil {
		return err
	}
	list, err := ls.ListEnvs(r.Context())
	if err != nil {
		return err
	}
	list = named(list, r.URL.Query().Get("name"), func(e api.Environment) string { return e.Name })
	shown := make([]api.Environment, 0, len(list))
	for _, e := range list {
		if e, ok := forCaller(r.Context(), e); ok { // publish.go
			shown = append(shown, e)
		}
	}
	return writeJSON(w, http.StatusOK, api.EnvironmentList{Environments: shown})
}

func (s *Server) getEnv(w http.ResponseWriter, r *http.Request) error {
	ls, err := s.layers()
	if err != nil {
		return err
	}
	env, err := ls.GetEnv(r.Context(), r.PathValue("ref"))
	if err != nil {
		return err
	}
	env, ok := forCaller(r.Context(), env) // publish.go
	if !ok {
		return errdefs.New(errdefs.ErrNotFound, api.CodeEnvNotFound, "environment %s not found", r.PathValue("ref"))
	}
	return writeJSON(w, http.StatusOK, env)
}

// envVerb serves POST /v1/environments/{ref}/VERB: publish, squash.
func (s *Server) envVerb(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.layers(); err != nil {
		return err
	}
	if ref, ok := strings.CutSuffix(r.PathValue("ref"), "/publish"); ok {
		return s.publishEnv(w, r, ref) // publish.go
	}
	if ref, ok := strings.CutSuffix(r.PathValue("ref"), "/squash"); ok {
		return s.squashEnv(w, r, ref) // squash.go
	}
	return errdefs.New(errdefs.ErrNotFound, api.CodeNotFound, "no route for %s %s", r.Method, r.URL.Path)
}

func (s *Server) deleteEnv(w http.ResponseWriter, r *http.Request) error {
	ls, err := s.layers()
	if err != nil {
		return err
	}
	if err := ls.DeleteEnv(r.Context(), r.PathValue("ref")); err != nil {
		return err
	}
	s.collectSoon()
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) gc(w http.ResponseWriter, r *http.Request) error {
	ls, err := s.layers()
	if err != nil {
		return err
	}
	live, err := s.liveLayers(r.Context())
	if err != nil {
		return err
	}
	res, err := ls.GC(r.Context(), live)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

func mediaTypeOf(r *http.Request) string {
	ct := r.Header.Get("Content-Type")
	mt, _, _ := strings.Cut(ct, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}

// named keeps the items called name; an empty name keeps all.
func named[T any](list []T, name string, nameOf func(T) string) []T {
	if name == "" {
		return list
	}
	kept := list[:0]
	for _, v := range list {
		if nameOf(v) == name {
			kept = append(kept, v)
		}
	}
	return kept
}
