package nodeapi

import (
	"context"
	"net/http"
	"sync"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/errdefs"
	"github.com/warrenhq/warren/internal/fncall"
	"github.com/warrenhq/warren/internal/httperr"
)

// FnCall on the node API, served once ServeFn gave the server a runner:
//
//	POST /v1/fn/run       api.FnRunRequest -> api.FnResult
//	POST /v1/fn/batch     api.FnBatchRequest -> api.FnBatchResult (per-call errors)
//	GET  /v1/fn/runtimes  api.FnRuntimeList
//
// and GET /v1/status then carries the runtimes in api.Node.FnRuntimes,
// which is how apiservers learn where each runtime runs and how busy its
// pool is. A node without a runner answers these paths 404.

// MaxFnBatch bounds the calls of one FnCall batch, here and on the
// apiserver (api.MaxFnBatch).
const MaxFnBatch = api.MaxFnBatch

// fnBatchParallel bounds how many calls of one batch run at once on a
// node: past its pool, more only turn into 429s.
const fnBatchParallel = 8

// ServeFn makes the server serve FnCall with r; a nil r serves none. Call
// it once, before the server serves. It returns s.
func (s *Server) ServeFn(r fncall.Runner) *Server {
	if r == nil {
		return s
	}
	s.fn = r
	h := s.authenticated
	s.mux.Handle("POST /v1/fn/run", h(s.fnRun))
	s.mux.Handle("POST /v1/fn/batch", h(s.fnBatch))
	s.mux.Handle("GET /v1/fn/runtimes", h(s.fnRuntimes))
	return s
}

// withFn adds the runner's runtimes to a node status.
func (s *Server) withFn(ctx context.Context, n api.Node) api.Node {
	if s.fn != nil {
		n.FnRuntimes = s.fn.Runtimes(ctx)
	}
	return n
}

func (s *Server) fnRun(w http.ResponseWriter, r *http.Request) error {
	var req api.FnRunRequest
	if err := httperr.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	res, err := s.runFn(r.Context(), req)
	if err != nil {
		return err
	}
	return httperr.WriteJSON(w, http.StatusOK, res)
}

func (s *Server) runFn(ctx context.Context, req api.FnRunRequest) (api.FnResult, error) {
	res, err := s.fn.Run(ctx, req)
	if err == nil && res.Node == "" {
		res.Node = s.agent.ID()
	}
	return res, err
}

func (s *Server) fnBatch(w http.ResponseWriter, r *http.Request) error {
	var req api.FnBatchRequest
	if err := httperr.DecodeJSON(w, r, &req); err != nil {
		return err
	}
	if n := len(req.Calls); n < 1 || n > MaxFnBatch {
		return errdefs.Invalid("a batch takes 1..%d calls, got %d", MaxFnBatch, n)
	}
	out := api.FnBatchResult{Results: RunFnCalls(r.Context(), req.Calls, fnBatchParallel, s.runFn)}
	return httperr.WriteJSON(w, http.StatusOK, out)
}

// RunFnCalls runs calls with run, at most parallel at a time, and returns
// their outcomes in order: a result, or the error as the API renders it.
// The node API and the apiserver answer a batch with it.
func RunFnCalls(ctx context.Context, calls []api.FnRunRequest, parallel int,
	run func(context.Context, api.FnRunRequest) (api.FnResult, error)) []api.FnBatchItem {
	items := make([]api.FnBatchItem, len(calls))
	sem := make(chan struct{}, max(parallel, 1))
	var wg sync.WaitGroup
	for i, c := range calls {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			res, err := run(ctx, c)
			if err != nil {
				_, e := httperr.ToAPI(err)
				items[i].Error = &e
				return
			}
			items[i].Result = &res
		})
	}
	wg.Wait()
	return items
}

func (s *Server) fnRuntimes(w http.ResponseWriter, r *http.Request) error {
	list := s.fn.Runtimes(r.Context())
	if list == nil {
		list = []api.FnRuntime{}
	}
	return httperr.WriteJSON(w, http.StatusOK, api.FnRuntimeList{Runtimes: list})
}

// RunFn runs one FnCall on the node. A refusal keeps its kind and code:
// 429 fn_overloaded is an errdefs.ErrExhausted with its Retry-After.
func (c *Client) RunFn(ctx context.Context, req api.FnRunRequest) (api.FnResult, error) {
	var res api.FnResult
	err := c.doJSON(ctx, http.MethodPost, "/v1/fn/run", nil, req, &res)
	return res, err
}

// RunFnBatch runs independent FnCalls on the node; each gets its result
// or its error.
func (c *Client) RunFnBatch(ctx context.Context, req api.FnBatchRequest) (api.FnBatchResult, error) {
	var res api.FnBatchResult
	err := c.doJSON(ctx, http.MethodPost, "/v1/fn/batch", nil, req, &res)
	return res, err
}

// ListFnRuntimes returns the runtimes the node declares, with their pools.
func (c *Client) ListFnRuntimes(ctx context.Context) ([]api.FnRuntime, error) {
	var list api.FnRuntimeList
	if err := c.doJSON(ctx, http.MethodGet, "/v1/fn/runtimes", nil, nil, &list); err != nil {
		return nil, err
	}
	if list.Runtimes == nil {
		list.Runtimes = []api.FnRuntime{}
	}
	return list.Runtimes, nil
}
