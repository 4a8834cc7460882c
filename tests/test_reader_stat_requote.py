"""stat_split's requote step (the commas of quoted fields put back) looks at columns from the
one holding the first such comma and stops when every one is found: on texts whose quoted
commas sit in one column, in several, in a column left of the first one found, or only in a
late row, the columns are still the csv module's fields."""
import csv
import io

import pytest

from opdump.analysis.reader.stat_split import split_columns

_TEXTS = [
    'a,b,Shape,x\n1,2,"(2,3)",4\n5,6,"(1,)",8\n',                   # the plain case: the shape
    'a,b,Shape,x\n1,2,"(2,3)",4\n"p,q",6,"()",8\n',                  # a second column, left, later row
    'a,b,Shape,x\n1,2,(),4\n5,6,(),"7,8"\n',                         # only the last field of the last row
    'a,b,Shape,x\n"1,1","2,2","(2,3)","4,4"\n5,6,7,8\n',             # every column
    'a,b,Shape,x\n1,"2,2",3,4\n5,6,"(9,9)",8\n9,"x,y,z",1,2\n',      # two columns, commas in several rows
    '"h,1",b\n1,2\n3,4\n',                                           # a quoted comma in the header only
]


@pytest.mark.parametrize("text", _TEXTS)
def test_requote_is_the_csv_module(text):
    got = split_columns(text)
    assert got is not None
    header, cols, n = got
    recs = list(csv.reader(io.StringIO(text, newline="")))
    assert header == recs[0]
    assert n == len(recs) - 1
    assert [list(c) for c in cols] == [list(c) for c in zip(*recs[1:])]
