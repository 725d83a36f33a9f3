//! Row matrices that storage backs (`rows::paging`): residency measured on a real file evicted
//! from the page cache, rows requested ahead arrive without their neighbours, and advice never
//! changes what the rows hold.

use spark_backend::rows::paging::{page_size, read_now, resident_fraction, Mode, Paging, Reading};
use spark_backend::rows::{RowMatrix, RowType};
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A read-only shared mapping of a file, unmapped on drop.
struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
    _file: File,
}

impl Mapped {
    /// Writes `bytes` to a new file, flushes it to storage, drops it from the page cache and
    /// maps it.
    fn evicted(bytes: &[u8]) -> Mapped {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "spark-paging-{}-{}.bin",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let mut f = File::create(&path).unwrap();
        f.write_all(bytes).unwrap();
        f.sync_all().unwrap();
        drop(f);
        let file = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        // SAFETY: a valid descriptor; clean pages (synced) can be dropped from the cache.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
        // SAFETY: a fresh read-only shared mapping of the whole file.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes.len(),
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        Mapped {
            ptr,
            len: bytes.len(),
            _file: file,
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is live for self's lifetime and covers len bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `evicted`.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// Whether the page holding byte `at` of `bytes` is in memory.
fn page_resident(bytes: &[u8], at: usize) -> bool {
    let page = page_size();
    let start = (bytes.as_ptr() as usize + at) / page * page;
    // SAFETY: `start` is the aligned start of a page inside the live mapping.
    let s = unsafe { std::slice::from_raw_parts(start as *const u8, page) };
    resident_fraction(s) == 1.0
}

/// 256 f32 rows of one page each (row j is page j), in a file evicted from the page cache.
fn evicted_matrix_file() -> (Vec<u8>, Mapped) {
    let page = page_size();
    let values: Vec<f32> = (0..256 * page / 4).map(|i| i as f32 * 0.5).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let map = Mapped::evicted(&bytes);
    assert!(
        resident_fraction(map.bytes()) < 0.5,
        "the evicted file is still {:.0} % in memory",
        resident_fraction(map.bytes()) * 100.0
    );
    (bytes, map)
}

/// Whether this system reads a page asked for with `MADV_WILLNEED` (Linux does; qemu-user, which
/// runs the aarch64 build of these tests, takes the advice and ignores it): a plain `madvise` on
/// an evicted file, not the code under test.
fn system_reads_willneed_pages() -> bool {
    let page = page_size();
    let map = Mapped::evicted(&vec![7u8; 16 * page]);
    let at = 5 * page;
    // SAFETY: one page inside the live mapping; the advice changes no contents.
    unsafe {
        libc::madvise(
            map.ptr.cast::<u8>().add(at).cast(),
            page,
            libc::MADV_WILLNEED,
        )
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if page_resident(map.bytes(), at) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    eprintln!("skipped: this system ignores MADV_WILLNEED (qemu-user does)");
    false
}

/// The file's 256 rows of one page each as a matrix.
fn page_rows(map: &Mapped) -> RowMatrix<'_> {
    RowMatrix::packed(RowType::F32, page_size() / 4, 256, map.bytes()).unwrap()
}

/// Waits up to 5 s for every page of `rows` of `map` to be in memory.
fn wait_resident(map: &Mapped, rows: &[usize]) {
    let page = page_size();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !rows.iter().all(|&j| page_resident(map.bytes(), j * page)) {
        assert!(Instant::now() < deadline, "rows not read within 5 s");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn an_evicted_file_that_fits_in_memory_is_requested_whole() {
    if !system_reads_willneed_pages() {
        return;
    }
    let (bytes, map) = evicted_matrix_file();
    let m = page_rows(&map);
    // 1 MiB: fits in any memory a test runs in.
    let paging = Paging::default();
    assert_eq!(paging.reading_in(Mode::Auto, &m, Some(3)), Reading::Whole);
    assert!(!paging.streaming_in(Mode::Auto, &m, Some(3)));
    wait_resident(&map, &(0..256).collect::<Vec<_>>());
    assert_eq!(map.bytes(), &bytes[..]);
}

/// Waits up to 10 s for every page of `map` to be in memory; the fraction in memory then.
fn wait_all_resident(map: &Mapped) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let fraction = resident_fraction(map.bytes());
        if fraction == 1.0 || Instant::now() >= deadline {
            return fraction;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_request_longer_than_the_readahead_window_is_read_whole() {
    // Linux reads ahead at most the readahead window (read_ahead_kb: 128 KiB by default, 8 MiB
    // on some VMs) of one MADV_WILLNEED's range: 48 MiB is longer than any of those, so only
    // requests made in pieces read it all
    if !system_reads_willneed_pages() {
        return;
    }
    let page = page_size();
    let n_rows = (48 << 20) / page;
    let bytes: Vec<u8> = (0..n_rows * page).map(|i| (i / 7) as u8).collect();
    // a whole matrix (a ubatch that reads most rows), then every row of one (their pages merge
    // into one range)
    for request in [
        (|m: &RowMatrix<'_>| Paging::request_share(m, 0, 1)) as fn(&RowMatrix<'_>),
        |m| Paging::request_rows(m, 0..(48 << 20) / page_size()),
    ] {
        let map = Mapped::evicted(&bytes);
        assert!(resident_fraction(map.bytes()) < 0.5, "not evicted");
        let m = RowMatrix::packed(RowType::F32, page / 4, n_rows, map.bytes()).unwrap();
        request(&m);
        let fraction = wait_all_resident(&map);
        assert_eq!(fraction, 1.0, "{:.1} % of 48 MiB read", fraction * 100.0);
        assert!(map.bytes() == &bytes[..], "requesting changed the bytes");
    }
}

#[test]
fn rows_requested_from_an_evicted_file_arrive_alone_and_unchanged() {
    if !system_reads_willneed_pages() {
        return;
    }
    let (bytes, map) = evicted_matrix_file();
    let m = page_rows(&map);
    let page = page_size();
    // As for a file larger than the memory available.
    let paging = Paging::default();
    assert_eq!(paging.reading_in(Mode::Always, &m, Some(7)), Reading::Rows);
    assert_eq!(
        paging.reading_in(Mode::Never, &m, Some(7)),
        Reading::InMemory
    );

    let wanted = [3usize, 4, 100, 101, 102, 250];
    Paging::request_rows(&m, wanted.iter().copied());
    wait_resident(&map, &wanted);
    // Far from every requested row: nothing was read around them.
    for far in [30usize, 60, 180, 220] {
        assert!(
            !page_resident(map.bytes(), far * page),
            "row {far} was read"
        );
    }
    // A fault on a row of a streaming matrix reads that row alone (MADV_RANDOM: without it, the
    // kernel reads ahead and around a faulted page of a mapping, tens of pages).
    let faulted = std::hint::black_box(map.bytes()[150 * page]);
    assert_eq!(faulted, bytes[150 * page]);
    for near in [146usize, 148, 152, 154] {
        assert!(
            !page_resident(map.bytes(), near * page),
            "row {near} was read with row 150"
        );
    }
    // The mapping holds what the file holds, requested or faulted.
    assert_eq!(map.bytes(), &bytes[..]);
}

#[test]
fn rows_side_by_side_are_requested_together_and_alone() {
    let page = page_size();
    // 128 neurons, each a K2 row of one page followed by a V row of one page (a paired file's
    // ffn_k2v: stride two pages), in the same evicted file as above.
    let (bytes, map) = evicted_matrix_file();
    let k2 = RowMatrix::new(RowType::F32, page / 4, 128, 2 * page, map.bytes()).unwrap();
    let v = RowMatrix::new(RowType::F32, page / 4, 128, 2 * page, &map.bytes()[page..]).unwrap();
    assert!(Paging::side_by_side(&k2, &v));
    assert!(
        !Paging::side_by_side(&v, &k2),
        "V's row j does not end where K2's row j starts"
    );
    let packed = page_rows(&map);
    assert!(!Paging::side_by_side(&packed, &packed));
    if !system_reads_willneed_pages() {
        return;
    }
    let wanted = [3usize, 40, 41, 100];
    Paging::request_rows_side_by_side(&k2, &v, wanted.iter().copied());
    let pages: Vec<usize> = wanted.iter().flat_map(|&j| [2 * j, 2 * j + 1]).collect();
    wait_resident(&map, &pages);
    for far in [20usize, 60, 120] {
        for p in [2 * far, 2 * far + 1] {
            assert!(!page_resident(map.bytes(), p * page), "page {p} was read");
        }
    }
    // A ubatch that reads most rows asks for its share of both at once: the second half of
    // the neurons is the second half of the pages, K2's and V's.
    Paging::request_share_side_by_side(&k2, &v, 1, 2);
    wait_resident(&map, &(128..256).collect::<Vec<_>>());
    assert!(
        !page_resident(map.bytes(), 60 * page),
        "the first half was read"
    );
    assert_eq!(map.bytes(), &bytes[..]);
}

#[test]
fn memory_no_file_backs_never_streams() {
    let page = page_size();
    let bytes = vec![1u8; 64 * page];
    let m = RowMatrix::packed(RowType::F32, page / 4, 64, &bytes).unwrap();
    assert_eq!(resident_fraction(&bytes), 1.0);
    assert_eq!(
        Paging::default().reading_in(Mode::Auto, &m, None),
        Reading::InMemory
    );
    assert_eq!(resident_fraction(&[]), 1.0);
}

#[test]
fn spark_paging_values_parse_and_others_are_named() {
    assert_eq!(Mode::parse(""), Ok(Mode::Auto));
    assert_eq!(Mode::parse("auto"), Ok(Mode::Auto));
    assert_eq!(Mode::parse("always"), Ok(Mode::Always));
    assert_eq!(Mode::parse("never"), Ok(Mode::Never));
    let err = Mode::parse("sometimes").unwrap_err();
    assert!(err.contains("'sometimes'"), "{err}");
}

#[test]
fn rows_read_at_load_are_all_in_memory_and_unchanged() {
    let (bytes, map) = evicted_matrix_file();
    // SAFETY: the ranges are the live mapping's.
    let missing = unsafe { read_now(&[map.bytes()]) };
    assert!(
        missing > 0 && missing <= bytes.len() as u64,
        "{missing} bytes were missing"
    );
    assert_eq!(resident_fraction(map.bytes()), 1.0, "not all read");
    assert!(map.bytes() == &bytes[..], "reading changed the rows");
    // SAFETY: as above.
    assert_eq!(
        unsafe { read_now(&[map.bytes(), &[]]) },
        0,
        "nothing left to read"
    );
}

#[test]
fn weights_read_whole_are_read_at_load_when_the_rows_stream() {
    use spark_backend::rows::budget::{self, Available, MemoryNeed, Source};
    use spark_backend::rows::paging::{spark_memory_loaded, spark_memory_resident, Bytes};
    // SAFETY: null with n = 0 is allowed; null with n > 0 is refused (contract), by both entries.
    assert_eq!(unsafe { spark_memory_resident(std::ptr::null(), 0) }, 0);
    assert_eq!(unsafe { spark_memory_resident(std::ptr::null(), 1) }, -1);
    assert_eq!(unsafe { spark_memory_loaded(std::ptr::null(), 0) }, 0);
    assert_eq!(unsafe { spark_memory_loaded(std::ptr::null(), 1) }, -1);
    let (bytes, map) = evicted_matrix_file();
    // A plan whose rows stream: 1 MiB read whole fits with its margin, 1 MiB of rows more does
    // not (the mapped bytes recorded are small, so the other tests' "fits" stays true).
    let need = MemoryNeed {
        mapped_whole: 1 << 20,
        mapped_rows: 1 << 20,
        ..MemoryNeed::default()
    };
    let left = Available {
        bytes: (1 << 20) + budget::FILL_MARGIN,
        source: Source::Env,
    };
    assert!(budget::decide(&need, Mode::Auto, Some(left))
        .unwrap()
        .is_some());
    assert_eq!(budget::last_plan(), Some(budget::Plan::RowsStream));
    let ranges = [Bytes {
        data: map.bytes().as_ptr().cast(),
        size: map.bytes().len() as u64,
    }];
    let locked_before = budget::locked_now().expect("VmLck");
    // SAFETY: one entry, the live mapping.
    assert_eq!(unsafe { spark_memory_resident(ranges.as_ptr(), 1) }, 0);
    assert_eq!(resident_fraction(map.bytes()), 1.0, "not all read");
    assert!(map.bytes() == &bytes[..], "reading changed the weights");
    let len = map.bytes().len() as u64;
    if !may_lock(len) {
        // a user who may not lock them: nothing counted, and the reason named
        assert_eq!(budget::pinned(), 0);
        let pinned = spark_backend::rows::paging::pin(&[map.bytes()]);
        let why = pinned.failed.expect("mlock beyond RLIMIT_MEMLOCK failed");
        assert!(why.contains("RLIMIT_MEMLOCK"), "{why}");
        return;
    }
    // pinned
    let locked = budget::locked_now().unwrap() - locked_before;
    assert!(locked >= len, "{locked} bytes locked of {len}");
    assert!(
        budget::pinned() >= len,
        "{} counted pinned",
        budget::pinned()
    );
    // a pinned range counts as in place for the weights weighed against MemAvailable
    let left = Available {
        bytes: 5 << 20,
        source: Source::MemAvailable,
    };
    assert_eq!(budget::left_for_mapped(left), left.bytes + budget::pinned());
    assert_eq!(
        budget::left_for_mapped(Available {
            source: Source::Env,
            ..left
        }),
        left.bytes
    );
    // pinning again locks nothing new; unmapping unlocks, and no longer counts
    let again = spark_backend::rows::paging::pin(&[map.bytes()]);
    assert_eq!((again.bytes, again.failed), (0, None));
    drop(map);
    assert!(
        budget::pinned() < len,
        "{} still counted pinned",
        budget::pinned()
    );
}

/// Whether this process may lock `bytes` more: with `CAP_IPC_LOCK` in its effective set (root's,
/// which tests run with in CI), or an `RLIMIT_MEMLOCK` with room for them.
fn may_lock(bytes: u64) -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct passed.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
    let locked = spark_backend::rows::budget::locked_now().unwrap_or(0);
    cap_eff & (1 << CAP_IPC_LOCK) != 0
        || (rc == 0 && (limit.rlim_cur == libc::RLIM_INFINITY || limit.rlim_cur >= bytes + locked))
}
