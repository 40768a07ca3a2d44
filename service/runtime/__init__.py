"""One executor per loaded model: worker threads, dynamic batching, a bounded queue."""
