//! Message buffers: page-aligned like OSU's, filled with a pattern that
//! depends on the message size, and checked after each size's run.
//!
//! Buffers are written ("touched") before each size is timed, so page
//! faults never land in a timed loop. The received bytes are checked
//! against the pattern after the timed loop: the figures are only printed
//! for data that arrived intact.

/// Alignment of message buffers: a page, as OSU's `align_buffer`.
pub const ALIGNMENT: usize = 4096;

/// A zeroed byte buffer whose start is aligned to [`ALIGNMENT`].
pub struct AlignedBuf {
    storage: Vec<u8>,
    offset: usize,
    len: usize,
}

impl AlignedBuf {
    /// A buffer of `len` zero bytes; an error (not an abort) if the memory
    /// cannot be had.
    pub fn new(len: usize) -> Result<AlignedBuf, String> {
        let total = len
            .checked_add(ALIGNMENT)
            .ok_or_else(|| format!("a buffer of {len} bytes is too large"))?;
        let mut storage = Vec::new();
        storage
            .try_reserve_exact(total)
            .map_err(|e| format!("cannot allocate a buffer of {len} bytes: {e}"))?;
        storage.resize(total, 0);
        let offset = storage.as_ptr().align_offset(ALIGNMENT);
        assert!(offset < ALIGNMENT, "a byte pointer can always be aligned");
        Ok(AlignedBuf {
            storage,
            offset,
            len,
        })
    }

    /// The buffer's bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.offset..self.offset + self.len]
    }

    /// The buffer's bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.offset..self.offset + self.len]
    }
}

/// Period of the pattern: a prime, so that it does not line up with
/// power-of-two sizes.
const PERIOD: usize = 251;

/// Fills `buf` with the pattern of a message of `size` bytes: bytes
/// 1..=251 cycling, starting at a place that depends on `size`. No byte is
/// 0, so a zeroed receive buffer never matches by chance.
pub fn fill_pattern(buf: &mut [u8], size: usize) {
    let first = size % PERIOD;
    let period: Vec<u8> = (0..PERIOD)
        .map(|i| ((first + i) % PERIOD) as u8 + 1)
        .collect();
    for chunk in buf.chunks_mut(PERIOD) {
        chunk.copy_from_slice(&period[..chunk.len()]);
    }
}

/// Checks that `received` holds copies of `expected`, back to back (one
/// message, or a window of them); the error names the first wrong byte.
pub fn check_messages(received: &[u8], expected: &[u8]) -> Result<(), String> {
    let size = expected.len();
    if size == 0 {
        return Ok(());
    }
    let messages = received.chunks_exact(size);
    if !messages.remainder().is_empty() {
        return Err(format!(
            "{} bytes received are not a whole number of {size}-byte messages",
            received.len()
        ));
    }
    for (message, got) in messages.enumerate() {
        if got != expected {
            let byte = got
                .iter()
                .zip(expected)
                .position(|(a, b)| a != b)
                .unwrap_or_default();
            return Err(format!(
                "received data is wrong: byte {byte} of message {message} (of {size} bytes) is {}, expected {}",
                got[byte], expected[byte]
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [0, 1, 4095, 4096, 100_000] {
            let mut b = AlignedBuf::new(len).unwrap();
            assert_eq!(b.as_slice().as_ptr() as usize % ALIGNMENT, 0);
            assert_eq!(b.as_slice().len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice().fill(7);
        }
    }

    #[test]
    fn pattern_round_trip_and_errors() {
        let mut expected = vec![0u8; 300];
        fill_pattern(&mut expected, 300);
        assert!(expected.iter().all(|&b| b != 0));
        assert_eq!(expected[0], (300 % 251) as u8 + 1);
        assert_eq!(expected[251], expected[0]);
        let mut window = vec![0u8; 3 * 300];
        assert!(check_messages(&window, &expected).is_err());
        for message in window.chunks_mut(300) {
            fill_pattern(message, 300);
        }
        check_messages(&window, &expected).unwrap();
        window[300 + 7] ^= 1;
        let e = check_messages(&window, &expected).unwrap_err();
        assert!(e.contains("byte 7 of message 1"), "{e}");
        assert!(check_messages(&window[..299], &expected).is_err());
        // Another size, another pattern.
        let mut other = vec![0u8; 300];
        fill_pattern(&mut other, 301);
        assert!(check_messages(&other, &expected).is_err());
        check_messages(&[], &[]).unwrap();
    }
}
