"""Running a model: the loaded context and its spans (`model`, `shard`, `serving`), the entry's
tokenizer, embedding and head (`entry`), positions, prefill chunks, sampling, and the one
compute thread with its turns (`compute`, `turns`)."""
