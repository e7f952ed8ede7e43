// Package api holds the wire types of warren's REST v1 API. It imports
// nothing of warren's own, so the Go SDK in client/ and any other program can
// depend on it alone. openapi.yaml in this directory describes the same API.
package api
