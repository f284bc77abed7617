// Vocabulary types shared by every component.
//
// Rows are addressed two ways:
//  - (table, row within table) as the data carries them;
//  - a linearised RowId = table_offset[table] + row, where table_offset is the cumulative sum
//    of the table sizes (FBGEMM's convention). The oracle, the servers and the caches speak
//    RowIds; only the data layer and the model know tables.
// A cache holds rows in slots 0 .. capacity-1 (SlotId); the oracle assigns them.
#ifndef BAGPIPE_CORE_TYPES_H_
#define BAGPIPE_CORE_TYPES_H_

#include <cstdint>
#include <limits>

namespace bagpipe {

using RowId = uint64_t;
using SlotId = int32_t;
using TableId = int32_t;
// Index of a global batch (= training iteration) in the stream, from 0.
using Iteration = int64_t;

inline constexpr SlotId kNoSlot = -1;
inline constexpr Iteration kNever = std::numeric_limits<Iteration>::max();

}  // namespace bagpipe

#endif  // BAGPIPE_CORE_TYPES_H_
