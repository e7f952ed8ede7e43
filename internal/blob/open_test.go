package blob_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/blob"
	"github.com/warrenhq/warren/internal/errdefs"
)

func TestParseS3(t *testing.T) {
	env := map[string]string{"AWS_ACCESS_KEY_ID": "ak", "AWS_SECRET_ACCESS_KEY": "sk"}
	getenv := func(k string) string { return env[k] }
	for _, tc := range []struct {
		spec string
		want blob.S3Config
	}{
		{"s3://warren", blob.S3Config{Bucket: "warren", Endpoint: blob.DefaultS3Endpoint, UseTLS: true}},
		{"s3://warren/blobs/prod/", blob.S3Config{Bucket: "warren", Prefix: "blobs/prod", Endpoint: blob.DefaultS3Endpoint, UseTLS: true}},
		{"s3://warren/p?endpoint=10.0.0.5:8333&region=eu-west-1",
			blob.S3Config{Bucket: "warren", Prefix: "p", Endpoint: "10.0.0.5:8333", UseTLS: true, Region: "eu-west-1"}},
		{"s3://warren/p?endpoint=http://127.0.0.1:8333", blob.S3Config{Bucket: "warren", Prefix: "p", Endpoint: "127.0.0.1:8333"}},
		{"s3://warren?endpoint=https://s3.example.com/", blob.S3Config{Bucket: "warren", Endpoint: "s3.example.com", UseTLS: true}},
	} {
		got, err := blob.ParseS3(tc.spec, getenv)
		tc.want.AccessKey, tc.want.SecretKey = "ak", "sk"
		if err != nil || got != tc.want {
			t.Errorf("ParseS3(%q):\n got %+v, %v\nwant %+v", tc.spec, got, err, tc.want)
		}
	}
	env["AWS_REGION"] = "us-east-2"
	if got, _ := blob.ParseS3("s3://warren", getenv); got.Region != "us-east-2" {
		t.Errorf("region from AWS_REGION: got %q", got.Region)
	}
	if got, _ := blob.ParseS3("s3://warren?region=ap-south-1", getenv); got.Region != "ap-south-1" {
		t.Errorf("?region= over AWS_REGION: got %q", got.Region)
	}
}

func TestParseS3Errors(t *testing.T) {
	env := map[string]string{"AWS_ACCESS_KEY_ID": "ak", "AWS_SECRET_ACCESS_KEY": "sk"}
	getenv := func(k string) string { return env[k] }
	for _, tc := range []struct{ spec, want string }{
		{"gs://bucket/p", `unknown scheme "gs"`},
		{"s3:///prefix", "no bucket"},
		{"s3://ab/p", `bucket "ab"`},
		{"s3://ak:sk@bucket/p", "credentials do not go in the URL"},
		{"s3://bucket/p?endpint=h:1", `unknown parameter "endpint"`},
		{"s3://bucket/p?endpoint=a:1&endpoint=b:2", "give endpoint once"},
		{"s3://bucket/p?endpoint=", "give endpoint once, with a value"},
		{"s3://bucket/p?endpoint=ftp://h:1", "want host:port"},
		{"s3://bucket/p?endpoint=http://h:1/path", "want host:port"},
		{"s3://bucket/p#frag", "unexpected #frag"},
		{"s3://bucket/p?endpoint=%zz", "query"},
	} {
		_, err := blob.ParseS3(tc.spec, getenv)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseS3(%q): got %v, want ErrInvalid saying %q", tc.spec, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "sk@") {
			t.Errorf("ParseS3(%q): the error shows the secret: %v", tc.spec, err)
		}
	}
	delete(env, "AWS_SECRET_ACCESS_KEY")
	if _, err := blob.ParseS3("s3://bucket/p", getenv); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "AWS_SECRET_ACCESS_KEY") {
		t.Errorf("no secret key: got %v, want ErrInvalid naming AWS_SECRET_ACCESS_KEY", err)
	}
}

func TestOpenDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "blobs")
	s, err := blob.Open(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*blob.Dir); !ok {
		t.Fatalf("Open(%q): a %T, want a *blob.Dir", dir, s)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Errorf("Open did not make the directory: %v", err)
	}
	for _, spec := range []string{"", "gs://bucket"} {
		if _, err := blob.Open(context.Background(), spec); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Open(%q): got %v, want ErrInvalid", spec, err)
		}
	}
}
