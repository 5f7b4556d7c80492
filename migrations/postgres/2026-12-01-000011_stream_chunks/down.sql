DROP TABLE stream_chunks;
