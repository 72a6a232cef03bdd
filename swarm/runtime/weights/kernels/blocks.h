/* GGUF's blocks as the block kernels read them (blocks.c, block_decode.h): every type decodes
   a chunk of up to 256 weights into int8 codes with a float scale and offset per 32 weights
   (slots 0..7) or per 16 (slots 0..15), weight = scale * code + offset, exactly (see
   block_decode.h for each type's codes). */
#ifndef SWARM_BLOCKS_H
#define SWARM_BLOCKS_H

#include <stdint.h>

#define CHUNK 256   /* weights decoded at once: one K-quant block, or eight of 32 */
/* how far ahead (bytes of a row's blocks) a pass asks for the weights it will read: without
   it a one-row pass waited on memory (Q6_K, one thread, 3584 x 18944: 12.9 ms, 7.0 with it) */
#ifndef BLOCK_PREFETCH_AHEAD
#define BLOCK_PREFETCH_AHEAD 2048
#endif
/* Where a pass that reads output rows r..r + side - 1 side by side asks for the blocks it will
   read next, from `at` (`done` bytes into its row): BLOCK_PREFETCH_AHEAD further into the
   row, or past its end the same distance into the row it reads after this one, `side` rows
   on. Asking past a row's end as if the rows were one stream fetched the wrong row when two
   ran side by side: short rows (a head of 3584 columns, 14 Q6_K blocks) then started cold
   and ran at half the speed of one row at a time. */
static inline const uint8_t *blocks_ahead(const uint8_t *at, int64_t done, int64_t row_bytes,
                                          int side) {
    return done + BLOCK_PREFETCH_AHEAD < row_bytes ? at + BLOCK_PREFETCH_AHEAD
                                                   : at + BLOCK_PREFETCH_AHEAD + (side - 1) * row_bytes;
}

#define SUB 16      /* the fewest weights sharing one scale and offset in a decoded chunk */

typedef struct {
    _Alignas(32) int8_t codes[CHUNK];
    float scale[CHUNK / SUB];
    float offset[CHUNK / SUB];
} Chunk;

/* A type's decoder (block_decode.h) fills a Chunk from `blocks` consecutive blocks (CHUNK
   weights, or fewer at a row's end); grid: the type's int8 grid, or NULL for types without
   one. blocks.c instantiates its rows once per type, so that the decoder inlines. */

#endif
