package blob

import (
	"context"
	"time"
)

// SetS3Limits lowers an S3 store's size thresholds so small test blobs take
// the multipart upload and multipart copy paths. singlePutMax < 0 sends
// every blob through a temporary object.
func SetS3Limits(s *S3, singlePutMax int64, partSize uint64, copyMax int64) {
	s.singlePutMax, s.partSize, s.copyMax = singlePutMax, partSize, copyMax
}

// RemoveStaleS3Temp runs the cleanup NewS3 runs, with any age.
func RemoveStaleS3Temp(ctx context.Context, s *S3, age time.Duration) { s.removeStaleTemp(ctx, age) }
