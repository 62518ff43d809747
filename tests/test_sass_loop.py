"""tools/sass_loop.py's reading of nvdisasm's output: the innermost loops that issue wgmmas, not the loops around
them nor the out-of-line retry blocks of a barrier wait that branch back into them."""
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import sass_loop  # noqa: E402

SASS = """
.L_x_1:
        /*0100*/                   UIADD3 UR4, UR4, 0x1, URZ ;
.L_x_2:
        /*0110*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR16+0x38000], R4 ;
        /*0120*/              @!P0 BRA `(.L_x_9) ;
.L_x_3:
        /*0130*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR16].tnspB, R24 ;
        /*0140*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR20].tnspB, R24, gsb0 ;
        /*0150*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0160*/               @P0 BRA `(.L_x_2) ;
        /*0170*/                   STG.E.64 desc[UR52][R4.64], R24 ;
        /*0180*/               @P1 BRA `(.L_x_1) ;
        /*0190*/                   EXIT ;
.L_x_9:
        /*01a0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR16+0x38000], R4 ;
        /*01b0*/              @!P0 BRA `(.L_x_9) ;
        /*01c0*/                   BRA `(.L_x_3) ;
"""


def test_the_k_loop_is_the_innermost_loop_with_wgmmas():
    (loop,) = sass_loop.wgmma_loops(SASS)
    assert [line.split("*/")[0] + "*/" for line in loop] == ["/*0110*/", "/*0120*/", "/*0130*/", "/*0140*/",
                                                             "/*0150*/", "/*0160*/"]
