"""Dataset loaders: built-ins on the shared data, checksums, fetch, csv/libsvm, IDX, Reuters.

Expected counts come from the shared folder's README/PROVENANCE files and the
Reuters-21578 README, not from runs of the loaders.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from streamlearn.datasets import DATASETS, base, load_dataset, mnist, resolve_data_dir, reuters, uci
from streamlearn.datasets.base import Dataset, DatasetFiles, RemoteFile, ensure_files, read_payload
from streamlearn.errors import ConfigError, DataError
from streamlearn.features import SparseBatch, hash_names

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"
needs_data = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"real-data test: the shared data folder {SHARED} is absent")


def _dense(ds: Dataset) -> np.ndarray:
    assert isinstance(ds.X, np.ndarray)
    return ds.X


def _sparse(ds: Dataset) -> SparseBatch:
    assert isinstance(ds.X, SparseBatch)
    return ds.X


# ---------------------------------------------------------------- built-ins on real data

BUILTIN_SHAPES = {  # name: (rows, features, classes, test_start, standardise)
    "letter": (20000, 16, 26, 16000, True),
    "pendigits": (7494 + 3498, 16, 10, 7494, True),
    "optdigits": (3823 + 1797, 64, 10, 3823, True),
    "nursery": (12960 - 2, 3 + 5 + 4 + 4 + 3 + 2 + 3 + 3, 4, None, False),
    "mnist": (10000, 784, 10, None, True),
}


@needs_data
@pytest.mark.parametrize("name", sorted(BUILTIN_SHAPES))
def test_builtin_loads_with_documented_shape(name: str) -> None:
    rows, features, classes, test_start, standardise = BUILTIN_SHAPES[name]
    ds = load_dataset(name, SHARED)
    assert isinstance(ds.X, np.ndarray) and ds.X.dtype == np.float64
    assert ds.X.shape == (rows, features) and ds.n_features == features
    assert ds.y.dtype == np.int64 and ds.n_classes == classes == len(ds.class_names)
    assert sorted(set(ds.y.tolist())) == list(range(classes))
    assert ds.test_start == test_start and ds.standardise is standardise
    assert np.isfinite(ds.X).all() and ds.description


@needs_data
def test_class_counts_match_provenance() -> None:
    letter = load_dataset("letter", SHARED)
    counts = dict(zip(letter.class_names, np.bincount(letter.y).tolist(), strict=True))
    assert (counts["A"], counts["M"], counts["Z"]) == (789, 792, 734)
    nursery = load_dataset("nursery", SHARED)
    counts = dict(zip(nursery.class_names, np.bincount(nursery.y).tolist(), strict=True))
    assert counts == {"not_recom": 4320, "priority": 4266, "spec_prior": 4044, "very_recom": 328}
    assert "recommend" not in nursery.class_names and "dropped" in nursery.description
    assert (_dense(nursery).sum(axis=1) == 8).all()  # one hot value per attribute
    optdigits = load_dataset("optdigits", SHARED)
    assert np.bincount(optdigits.y[optdigits.test_start:]).tolist() == [
        178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


@needs_data
def test_mnist_scaled_to_unit_interval() -> None:
    ds = load_dataset("mnist", SHARED)
    X = _dense(ds)
    assert X.min() == 0.0 and X.max() == 1.0
    assert np.allclose(X * 255, np.round(X * 255))


def test_synthetic_options_and_determinism() -> None:
    a = load_dataset("synnonsep", n_rows=300, seed=4)
    b = load_dataset("synnonsep", n_rows="300", seed="4")  # CLI-style strings
    assert a.X.shape == (300, 400) and a.n_classes == 9 and not a.standardise
    assert np.array_equal(_dense(a), _dense(b)) and np.array_equal(a.y, b.y)
    assert not np.array_equal(load_dataset("synsep", n_rows=300, seed=5).y, a.y)
    with pytest.raises(ConfigError, match="n_rows"):
        load_dataset("synsep", n_rows=0)
    with pytest.raises(ConfigError, match=r"Got \['rows'\] instead"):
        load_dataset("synsep", rows=10)


def test_unknown_dataset_and_option() -> None:
    with pytest.raises(ConfigError) as info:
        load_dataset("foo")
    assert str(info.value) == (f"Expected a dataset in {sorted(DATASETS)} or csv:PATH / "
                               f"libsvm:PATH. Got 'foo' instead.")
    with pytest.raises(ConfigError, match="options of dataset 'letter'"):
        load_dataset("letter", SHARED, n_rows=5)


def test_dataset_record_validates_itself() -> None:
    with pytest.raises(DataError, match="labels outside"):
        Dataset("t", np.zeros((2, 1)), np.array([0, 2]), 2, ["a", "b"], 1, "", False)
    with pytest.raises(DataError, match="int64 labels"):
        Dataset("t", np.zeros((2, 1)), np.array([0, 1, 1]), 2, ["a", "b"], 1, "", False)


# ---------------------------------------------------------------- data dir, checksums, fetch

def test_resolve_data_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STREAMLEARN_DATA_DIR", str(tmp_path / "env"))
    assert resolve_data_dir(str(tmp_path / "cli")) == tmp_path / "cli"
    assert resolve_data_dir(None) == tmp_path / "env"
    monkeypatch.delenv("STREAMLEARN_DATA_DIR")
    monkeypatch.setattr(base, "SHARED_DATA_DIR", tmp_path)
    assert resolve_data_dir(None) == tmp_path
    monkeypatch.setattr(base, "SHARED_DATA_DIR", tmp_path / "absent")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve_data_dir(None) == tmp_path / "xdg" / "streamlearn"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_data_dir(None) == tmp_path / "home" / ".cache" / "streamlearn"


def test_missing_dataset_error_says_where_and_how(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        load_dataset("letter", tmp_path / "nowhere")
    message = str(info.value)
    for part in ("'letter'", str(tmp_path / "nowhere"), "does not exist", "--data-dir",
                 "STREAMLEARN_DATA_DIR", "--fetch", "letter/letter-recognition.data"):
        assert part in message


@needs_data
def test_checksum_mismatch_is_a_data_error(tmp_path: Path) -> None:
    data = bytearray((SHARED / "letter" / "letter-recognition.data").read_bytes())
    data[100] = ord("9") if data[100] != ord("9") else ord("8")
    (tmp_path / "letter").mkdir()
    (tmp_path / "letter" / "letter-recognition.data").write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"Checksum mismatch for letter/letter-recognition\.data"):
        load_dataset("letter", tmp_path)


@needs_data
def test_fetch_from_file_url_into_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    source = SHARED / "letter" / "letter-recognition.data"
    (spec_file,) = uci.LETTER.files
    spec = DatasetFiles("letter", (RemoteFile(spec_file.path, source.as_uri(), spec_file.sha256,
                                              spec_file.size),))
    monkeypatch.setattr(uci, "LETTER", spec)
    cache = tmp_path / "cache"
    fetched = load_dataset("letter", cache, fetch=True)
    assert (cache / "letter" / "letter-recognition.data").read_bytes() == source.read_bytes()
    assert np.array_equal(_dense(fetched), _dense(load_dataset("letter", SHARED)))
    assert [p.name for p in (cache / "letter").iterdir()] == ["letter-recognition.data"]
    load_dataset("letter", cache)  # now present: no fetch needed


def test_fetch_rejects_wrong_content_and_leaves_nothing(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.txt"
    wrong.write_bytes(b"not the data\n")
    spec = DatasetFiles("toy", (RemoteFile("toy/a.txt", wrong.as_uri(), "0" * 64, 13),))
    with pytest.raises(DataError, match=r"Checksum mismatch for toy/a\.txt"):
        ensure_files(spec, tmp_path / "cache", fetch=True)
    assert list((tmp_path / "cache" / "toy").iterdir()) == []
    absent = DatasetFiles("toy", (RemoteFile("toy/a.txt", (tmp_path / "no").as_uri(), "0" * 64, 1),))
    with pytest.raises(DataError, match="Could not download"):
        ensure_files(absent, tmp_path / "cache", fetch=True)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_fetch_gz_and_tar_member_verify_decompressed_payload(tmp_path: Path) -> None:
    payload_a, payload_b = b"alpha\n" * 50, b"beta\n" * 40
    # a mirror's gzip wrapper (own mtime) still verifies: the checksum is of the payload
    mirror_gz = tmp_path / "a.gz"
    mirror_gz.write_bytes(gzip.compress(payload_a, mtime=123456))
    archive = tmp_path / "bundle.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("bundle/b.sgm")
        info.size = len(payload_b)
        tar.addfile(info, io.BytesIO(payload_b))
    spec = DatasetFiles("toy", (
        RemoteFile("toy/a.gz", mirror_gz.as_uri(), _sha(payload_a), len(payload_a)),
        RemoteFile("toy/b.sgm.gz", archive.as_uri(), _sha(payload_b), len(payload_b),
                   member="b.sgm"),
    ))
    paths = ensure_files(spec, tmp_path / "cache", fetch=True)
    assert [read_payload(p, f) for p, f in zip(paths, spec.files, strict=True)] == [
        payload_a, payload_b]
    assert paths[1].read_bytes()[:2] == b"\x1f\x8b"  # stored gzip-compressed
    # a user-decompressed copy is accepted in place of the .gz
    plain = tmp_path / "plain"
    (plain / "toy").mkdir(parents=True)
    (plain / "toy" / "a").write_bytes(payload_a)
    (plain / "toy" / "b.sgm").write_bytes(payload_b)
    assert [p.name for p in ensure_files(spec, plain, fetch=False)] == ["a", "b.sgm"]


# ---------------------------------------------------------------- IDX

def test_idx_truncated_and_bad_magic() -> None:
    header = bytes([0, 0, 8, 3]) + b"".join(n.to_bytes(4, "big") for n in (2, 3, 3))
    assert mnist.parse_idx(header + bytes(18)).shape == (2, 3, 3)
    with pytest.raises(DataError, match=r"truncated: dimensions \(2, 3, 3\) need 18 bytes"):
        mnist.parse_idx(header + bytes(17))
    with pytest.raises(DataError, match="truncated IDX header"):
        mnist.parse_idx(header[:10])
    with pytest.raises(DataError, match="expected an IDX file"):
        mnist.parse_idx(b"\x1f\x8b\x08\x00")


@needs_data
def test_truncated_mnist_gzip_is_a_data_error(tmp_path: Path) -> None:
    (tmp_path / "mnist").mkdir()
    for f in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        raw = (SHARED / "mnist" / f).read_bytes()
        (tmp_path / "mnist" / f).write_bytes(raw if "labels" in f else raw[: len(raw) // 2])
    with pytest.raises(DataError, match="not a valid gzip file"):
        load_dataset("mnist", tmp_path)


# ---------------------------------------------------------------- Reuters

@pytest.fixture(scope="module")
def reuters_docs() -> list[reuters.ReutersDoc]:
    if not SHARED.is_dir():
        pytest.skip(f"real-data test: the shared data folder {SHARED} is absent")
    return reuters.load_reuters(SHARED)


def test_reuters_counts_match_readme(reuters_docs: list[reuters.ReutersDoc]) -> None:
    assert len(reuters_docs) == 21578
    assert [d.newid for d in reuters_docs] == list(range(1, 21579))
    splits = Counter(d.lewissplit for d in reuters_docs)
    assert splits == {"TRAIN": 14668, "TEST": 6188, "NOT-USED": 722}
    assert Counter(d.has_topics for d in reuters_docs)["BYPASS"] == 1043
    train, test = reuters.modapte_split(reuters_docs)
    assert (len(train), len(test)) == (9603, 3299)
    first = reuters_docs[0]
    assert (first.topics, first.title, first.cgisplit) == (("cocoa",), "BAHIA COCOA REVIEW",
                                                          "TRAINING-SET")
    assert first.body.startswith("Showers continued") and first.body.endswith("Reuter")
    assert reuters_docs[1].title == "STANDARD OIL <SRD> TO FORM FINANCIAL UNIT"


def test_reuters_text_is_clean(reuters_docs: list[reuters.ReutersDoc]) -> None:
    # ticker symbols such as "<SRD>" are text; SGML markup, entities and controls are not
    dirty = re.compile(r"&#\d+;|&lt;|&amp;|[\x00-\x08\x0b-\x1f\x7f]|"
                       r"</?(TITLE|BODY|TEXT|DATELINE|AUTHOR|TOPICS)\b|</D>")
    assert not [d.newid for d in reuters_docs if dirty.search(d.title + d.body)]
    assert sum(1 for d in reuters_docs if d.body) > 19000


def test_tokenize() -> None:
    assert reuters.tokenize("The U.S. OIL price, 3rd-qtr: x y Reuter") == [
        "oil", "price", "rd", "qtr"]


def test_bag_of_words_matches_naive_hashing() -> None:
    docs = [["oil", "oil", "price", "crude"], ["earn"], [], ["price"] * 5 + ["oil"]]
    X = reuters.bag_of_words(docs, n_features=8)  # few buckets: collisions happen
    expected = np.zeros((len(docs), 8))
    for i, doc in enumerate(docs):
        counts = Counter(doc)
        row = hash_names([list(counts)], 8, [[np.log1p(c) for c in counts.values()]])
        np.add.at(expected[i], row.indices, row.values)
        norm = np.linalg.norm(expected[i])
        expected[i] /= norm if norm else 1.0
    assert np.allclose(X.to_dense(), expected)


def test_reuters4(reuters_docs: list[reuters.ReutersDoc]) -> None:
    ds = load_dataset("reuters4", SHARED, n_features=4096)
    four = ("earn", "acq", "crude", "trade")
    expected = [next(t for t in four if t in d.topics) for d in reuters_docs
                if sum(t in d.topics for t in four) == 1]
    assert ds.class_names == list(four) and ds.X.shape == (len(expected), 4096)
    assert [ds.class_names[k] for k in ds.y] == expected
    X = _sparse(ds)
    norms = np.sqrt(np.bincount(X.row_ids(), X.values**2, minlength=ds.n_rows))
    assert np.allclose(norms[norms > 0], 1.0) and (norms > 0).mean() > 0.99
    for topic, count in Counter(expected).items():
        assert f"{topic} {count:,}" in ds.description
    with pytest.raises(ConfigError, match="'subset'"):
        load_dataset("reuters4", SHARED, subset="lewis")


# ---------------------------------------------------------------- csv:PATH

def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_csv_happy_paths(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", "w,colour,y\n1.5,red,10\n2,blue,9\n-1,red,10\n\n")
    ds = load_dataset(f"csv:{path}", categorical="colour")
    assert ds.class_names == ["9", "10"] and ds.y.tolist() == [1, 0, 1]  # numeric order
    assert _dense(ds).tolist() == [[1.5, 0, 1], [2, 1, 0], [-1, 0, 1]]  # blue, red one-hot
    assert ds.standardise and ds.name == f"csv:{path}"
    by_index = load_dataset(f"csv:{path}", label_column=0, categorical=[1, "y"])
    assert by_index.class_names == ["-1", "1.5", "2"] and by_index.n_features == 4
    headless = _write(tmp_path, "b.csv", "cat,1,2\ndog,3,4\ncat,5,6\n")
    ds = load_dataset(f"csv:{headless}", label_column="0")
    assert ds.class_names == ["cat", "dog"] and _dense(ds).tolist() == [[1, 2], [3, 4], [5, 6]]
    forced = _write(tmp_path, "c.csv", "a,b,label\nx,y,p\nz,y,q\n")
    ds = load_dataset(f"csv:{forced}", header=True, categorical="a,b")
    assert ds.n_rows == 2 and ds.n_features == 3 and not ds.standardise


@pytest.mark.parametrize(("text", "options", "message"), [
    ("a,b,c\n1,2,3\n4,5\n", {}, r"line 3 has 2 fields, expected 3"),
    ("a,b,c\n1,2,3\n4,x5,6\n", {}, r"column 'b', line 3: expected a number. Got 'x5'"),
    ("a,b,c\n1,nan,3\n4,5,6\n", {}, r"column 'b', line 2: expected a finite number. Got 'nan'"),
    ("a,b,c\n1,2,3\n4,inf,6\n", {}, r"line 3: expected a finite number. Got 'inf'"),
    ("a,b,c\n1,,3\n4,5,6\n", {}, r"line 2: expected a number. Got ''"),
    ("a,b,c\n1,2,3\n4,5,3\n", {}, r"Expected at least 2 classes in label column 'c'.* Got 1"),
    ("", {}, r"is empty"),
    ("a,b,c\n", {"header": True}, r"has a header but no data rows"),
])
def test_csv_errors(tmp_path: Path, text: str, options: dict[str, bool], message: str) -> None:
    path = _write(tmp_path, "bad.csv", text)
    with pytest.raises(DataError, match=message):
        load_dataset(f"csv:{path}", **options)  # type: ignore[arg-type]


def test_csv_config_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"csv file not found: .*missing\.csv"):
        load_dataset(f"csv:{tmp_path / 'missing.csv'}")
    path = _write(tmp_path, "a.csv", "a,b\n1,2\n3,4\n")
    with pytest.raises(ConfigError, match="Got 'zz'; columns are"):
        load_dataset(f"csv:{path}", label_column="zz")
    with pytest.raises(ConfigError, match="Got 5"):
        load_dataset(f"csv:{path}", label_column=5)
    with pytest.raises(ConfigError, match="must be true or false"):
        load_dataset(f"csv:{path}", header="maybe")


# ---------------------------------------------------------------- libsvm:PATH

def test_libsvm_happy_paths(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.svm", "+1 1:0.5 3:2 # comment\n-1 qid:7 2:1\n\n+1\n")
    ds = load_dataset(f"libsvm:{path}")
    assert ds.class_names == ["-1", "1"] and ds.y.tolist() == [1, 0, 1]
    assert _sparse(ds).to_dense().tolist() == [[0.5, 0, 2], [0, 1, 0], [0, 0, 0]]  # 1-based
    assert not ds.standardise
    zero_based = _write(tmp_path, "b.svm", "a 0:1 2:3\nb 1:4\n")
    ds = load_dataset(f"libsvm:{zero_based}", n_features=10)
    assert ds.X.shape == (2, 10) and _sparse(ds).to_dense()[0, :3].tolist() == [1, 0, 3]
    assert ds.class_names == ["a", "b"]


@pytest.mark.parametrize(("text", "message"), [
    ("1 1:2\n0 3\n", r"line 2: expected index:value. Got '3'"),
    ("1 1:2\n0 x:3\n", r"feature index, line 2: expected a number. Got 'x'"),
    ("1 1:2\n0 1.5:3\n", r"line 2: expected a non-negative integer feature index. Got '1.5'"),
    ("1 1:2\n0 2:abc\n", r"feature value, line 2: expected a number. Got 'abc'"),
    ("1 1:2\n0 2:nan\n", r"line 2: expected a finite number. Got 'nan'"),
    ("1 1:2\n1 2:1\n", r"Expected at least 2 classes in the labels of .*Got 1 \('1'\)"),
    ("1 1:2\nl 2:1\n", r"label, line 2: expected a number. Got 'l'"),
    ("# only a comment\n\n", r"is empty"),
])
def test_libsvm_errors(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, "bad.svm", text)
    with pytest.raises(DataError, match=message):
        load_dataset(f"libsvm:{path}")


def test_libsvm_config_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="libsvm file not found"):
        load_dataset(f"libsvm:{tmp_path / 'missing.svm'}")
    path = _write(tmp_path, "a.svm", "1 5:1\n0 1:1\n")
    with pytest.raises(ConfigError, match="at least 5"):
        load_dataset(f"libsvm:{path}", n_features=3)


@pytest.mark.parametrize(("delimiter", "sep"), [("tab", "\t"), ("\\t", "\t"), (";", ";"),
                                                ("semicolon", ";"), ("|", "|")])
def test_csv_delimiters(tmp_path: Path, delimiter: str, sep: str) -> None:
    rows = ["a,b,label", "1,2,x", "3,4,y", "5,6,x"]
    path = _write(tmp_path, "d.csv", "\n".join(r.replace(",", sep) for r in rows) + "\n")
    ds = load_dataset(f"csv:{path}", delimiter=delimiter)
    assert ds.class_names == ["x", "y"] and _dense(ds).tolist() == [[1, 2], [3, 4], [5, 6]]
    with pytest.raises(ConfigError, match=r"'delimiter' option .* must be one character"):
        load_dataset(f"csv:{path}", delimiter=";;")


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_csv_and_libsvm_read_compressed_files(tmp_path: Path, suffix: str) -> None:
    import bz2
    import gzip
    import lzma

    compress = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}[suffix]
    csv_path = tmp_path / f"a.csv{suffix}"
    csv_path.write_bytes(compress(b"a,b,label\n1,2,x\n3,4,y\n"))
    assert load_dataset(f"csv:{csv_path}").n_rows == 2
    svm_path = tmp_path / f"a.svm{suffix}"
    svm_path.write_bytes(compress(b"1 1:0.5\n0 2:1\n"))
    assert load_dataset(f"libsvm:{svm_path}").X.shape == (2, 2)
    broken = tmp_path / f"broken.csv{suffix}"
    broken.write_bytes(b"not compressed at all")
    with pytest.raises(DataError, match=rf"is not a valid \{suffix} file"):
        load_dataset(f"csv:{broken}")


@pytest.mark.parametrize(("text", "options", "rows", "classes"), [
    # a header with numeric names above numeric labels: names over numbers → header
    ("0,1,2,label\n1,2,3,0\n4,5,6,1\n7,8,9,0\n", {}, 3, ["0", "1"]),
    # numeric feature names, text labels: the label field 'y' occurs nowhere else
    ("0,1,y\n1,2,a\n3,4,b\n5,6,a\n", {"header": "yes"}, 3, ["a", "b"]),
    ("0,1,y\n1,2,a\n3,4,b\n5,6,a\n", {"label_column": "y"}, 3, ["a", "b"]),
    # a first data row whose class occurs again is data
    ("0,1,a\n1,2,b\n3,4,a\n", {}, 3, ["a", "b"]),
    ("0,1,y\n1,2,a\n3,4,b\n", {"header": "no"}, 3, ["a", "b", "y"]),
])
def test_csv_header_auto_never_makes_a_header_a_class(
        tmp_path: Path, text: str, options: dict[str, str], rows: int, classes: list[str]) -> None:
    ds = load_dataset(f"csv:{_write(tmp_path, 'h.csv', text)}", **options)  # type: ignore[arg-type]
    assert ds.n_rows == rows and ds.class_names == classes


@pytest.mark.parametrize("text", ["0,1,y\n1,2,a\n3,4,b\n5,6,a\n",
                                  "colour,size,label\nred,big,yes\nblue,small,no\nred,small,no\n"])
def test_csv_header_auto_refuses_when_line_1_would_be_a_one_row_class(
        tmp_path: Path, text: str) -> None:
    with pytest.raises(DataError, match=r"cannot tell whether line 1 is a header: its label field "
                                        r"'(y|label)' occurs on no other line.* Expected --header "
                                        r"yes or --header no"):
        load_dataset(f"csv:{_write(tmp_path, 'h.csv', text)}")


@pytest.mark.parametrize("text", ["a,b,label,\n1,2,x,\n3,4,y,\n", "a,b,label\n1,2,x,\n3,4,y,\n"])
def test_csv_trailing_delimiter_is_named(tmp_path: Path, text: str) -> None:
    with pytest.raises(DataError, match=r"every line ends with the delimiter ',', so the last "
                                        r"column is empty.*Remove the trailing delimiters"):
        load_dataset(f"csv:{_write(tmp_path, 't.csv', text)}")


@pytest.mark.parametrize(("text", "line"), [
    ("sepal,petal,class\n0.1,0.2,a\n0.3,0.4,b\n" + "0.5 1:2\n" * 20, 1),
    ("# exported\n\n5.1,3.5,setosa\n4.9,3.0,versicolor\n", 3),
    ("1:0.5 2:1\n0 1:1\n", 1),
])
def test_libsvm_refuses_a_non_libsvm_file_at_its_first_line(tmp_path: Path, text: str,
                                                            line: int) -> None:
    with pytest.raises(DataError, match=rf": line {line}: expected a libsvm line 'label "
                                        rf"index:value \.\.\.' starting with a label"):
        load_dataset(f"libsvm:{_write(tmp_path, 'x.svm', text)}")


def test_libsvm_refuses_a_file_without_any_pair(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"Got 3 line\(s\) without any index:value pair, from "
                                        r"line 1 on: 'alpha'"):
        path = _write(tmp_path, "x.svm", "alpha\nbeta\ngamma\n")
        load_dataset(f"libsvm:{path}")


def test_a_header_only_csv_says_it_has_no_data(tmp_path: Path) -> None:
    """It used to be read as a data row ('column 0, line 1: expected a number. Got 'a'')."""
    with pytest.raises(DataError, match=r"has a header but no data rows"):
        load_dataset("csv:" + str(_write(tmp_path, "h.csv", "a,b,label\n")))


def test_a_data_dir_that_is_a_file_is_said_to_be_one(tmp_path: Path) -> None:
    file = _write(tmp_path, "f.txt", "x")
    with pytest.raises(DataError, match=r"\(not a directory\)"):
        load_dataset("letter", data_dir=file)
