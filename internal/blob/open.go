package blob

import (
	"context"
	"net/url"
	"os"
	"strings"

	"github.com/minio/minio-go/v7/pkg/s3utils"
	"github.com/warrenhq/warren/internal/errdefs"
)

// Open opens the store that spec names, as every server role's --blobs
// takes it:
//
//	/mnt/shared/warren-blobs                   a directory (Dir), made if missing
//	s3://bucket[/prefix][?endpoint=E&region=R]  an S3 bucket (S3), which must exist
//
// An S3 endpoint is host[:port] (HTTPS) or http://host[:port] (plain
// HTTP, for a store on a trusted network); without one, AWS S3 itself.
// Credentials come from the environment, as AWS tools take them:
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; AWS_REGION is the default
// region. ErrInvalid for a spec that does not parse; NewDir's and NewS3's
// errors otherwise (ErrUnavailable: the S3 server cannot be reached, or
// refuses the credentials, or has no such bucket).
func Open(ctx context.Context, spec string) (Store, error) {
	if !strings.Contains(spec, "://") {
		if spec == "" {
			return nil, errdefs.Invalid("blob store: empty spec: want a directory or s3://bucket/prefix")
		}
		return NewDir(spec)
	}
	cfg, err := ParseS3(spec, os.Getenv)
	if err != nil {
		return nil, err
	}
	return NewS3(ctx, cfg)
}

// DefaultS3Endpoint is AWS S3's, for an s3:// spec that names none.
const DefaultS3Endpoint = "s3.amazonaws.com"

// ParseS3 reads an s3:// spec (see Open) into an S3Config, with the
// credentials and default region from getenv. ErrInvalid, saying what is
// wrong, for another scheme, a missing or malformed bucket, credentials in
// the URL, an unknown or repeated query parameter, a bad endpoint, or
// missing credentials.
func ParseS3(spec string, getenv func(string) string) (S3Config, error) {
	u, err := url.Parse(spec)
	if err != nil {
		return S3Config{}, errdefs.Invalid("blob store %q: %v", spec, err)
	}
	if u.Scheme != "s3" {
		return S3Config{}, errdefs.Invalid("blob store %q: unknown scheme %q: want a directory or s3://bucket/prefix", spec, u.Scheme)
	}
	if u.User != nil {
		return S3Config{}, errdefs.Invalid("blob store %s: credentials do not go in the URL: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", u.Redacted())
	}
	if u.Host == "" {
		return S3Config{}, errdefs.Invalid("blob store %q: no bucket: want s3://bucket/prefix", spec)
	}
	if err := s3utils.CheckValidBucketName(u.Host); err != nil {
		return S3Config{}, errdefs.Invalid("blob store %q: bucket %q: %v", spec, u.Host, err)
	}
	if u.Fragment != "" {
		return S3Config{}, errdefs.Invalid("blob store %q: unexpected #%s", spec, u.Fragment)
	}
	cfg := S3Config{
		Bucket:    u.Host,
		Prefix:    strings.Trim(u.Path, "/"),
		Endpoint:  DefaultS3Endpoint,
		UseTLS:    true,
		Region:    getenv("AWS_REGION"),
		AccessKey: getenv("AWS_ACCESS_KEY_ID"),
		SecretKey: getenv("AWS_SECRET_ACCESS_KEY"),
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return S3Config{}, errdefs.Invalid("blob store %q: query: %v", spec, err)
	}
	for k, vs := range q {
		if len(vs) != 1 || vs[0] == "" {
			return S3Config{}, errdefs.Invalid("blob store %q: give %s once, with a value", spec, k)
		}
		v := vs[0]
		switch k {
		case "endpoint":
			if cfg.Endpoint, cfg.UseTLS, err = s3Endpoint(v); err != nil {
				return S3Config{}, errdefs.Invalid("blob store %q: %v", spec, err)
			}
		case "region":
			cfg.Region = v
		default:
			return S3Config{}, errdefs.Invalid("blob store %q: unknown parameter %q: want endpoint or region", spec, k)
		}
	}
	if cfg.AccessKey == "" || cfg.SecretKey == "" {
		return S3Config{}, errdefs.Invalid("blob store %s: no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", spec)
	}
	return cfg, nil
}

// s3Endpoint reads an endpoint parameter: host[:port] (HTTPS), or an
// http:// or https:// URL with nothing after the host.
func s3Endpoint(v string) (hostPort string, tls bool, err error) {
	scheme, rest, ok := strings.Cut(v, "://")
	if !ok {
		scheme, rest = "https", v
	}
	switch scheme {
	case "http", "https":
	default:
		return "", false, errdefs.Invalid("endpoint %q: want host:port, http://host:port or https://host:port", v)
	}
	rest = strings.TrimSuffix(rest, "/")
	if rest == "" || strings.ContainsAny(rest, "/?#@ ") {
		return "", false, errdefs.Invalid("endpoint %q: want host:port, http://host:port or https://host:port", v)
	}
	return rest, scheme == "https", nil
}
