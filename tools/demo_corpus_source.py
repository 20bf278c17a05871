"""Source of the embedded demo corpus (fictional ACME Group). Run to (re)write ragspine_pipeline/demo_corpus/.

Kept as one reviewable file so the corpus and its metadata change together; the written
files under ragspine_pipeline/demo_corpus/ (package data, shipped in the wheel) are what the product reads.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "ragspine_pipeline" / "demo_corpus"

R, INT, P = "RESTRICTED", "INTERNAL", "PUBLIC"

DOCS: list[dict] = [
# ----------------------------------------------------------------- acme_reports (zh)
dict(lib="acme_reports", id="ar2023_cn_revenue", title="2023年年度报告 · 艾克美中国 · 经营回顾",
     entity="ACME_CN", period="2023", geography="CN", topic="financial_results", language="zh", sensitivity=P,
     text="""2023年，艾克美中国实现营业收入48.6亿元，同比下降12.4%。营收下滑的主要原因有三：一是房地产市场持续低迷，新房交付量减少，智能家居传感器的前装订单同比减少约三成；二是行业价格战加剧，主要竞争对手将温湿度模组价格下调15%以上，公司为保住份额被迫跟进；三是第一大客户华辰地产推迟了全年的集中采购。

分产品看，智能家居业务收入21.3亿元，下降27.8%；工业传感器业务收入19.8亿元，基本持平；新能源汽车传感器业务收入7.5亿元，增长41.2%，成为唯一保持高速增长的板块。

毛利率由上年的31.5%降至26.9%，下降4.6个百分点，主要受价格下调和产能利用率不足影响。期间费用率上升至18.2%，其中研发投入4.1亿元，占收入比重8.4%。

展望2024年，管理层将收缩智能家居前装渠道，加大新能源汽车和储能领域的投入，并推动降本增效计划，目标是将毛利率恢复到29%以上。"""),
dict(lib="acme_reports", id="ar2023_cn_risk", title="2023年年度报告 · 艾克美中国 · 风险因素",
     entity="ACME_CN", period="2023", geography="CN", topic="risk", language="zh", sensitivity=P,
     text="""汇率风险：公司约35%的原材料以美元计价采购，2023年人民币对美元贬值约5%，推高了芯片和陶瓷基板的采购成本，全年汇兑损失约0.9亿元。

客户集中风险：前五大客户收入占比为46%，其中华辰地产占比14%。华辰地产推迟采购直接导致第三季度收入环比下降18%。公司已与另外两家头部开发商签订框架协议，以降低对单一客户的依赖。

供应链风险：高端MEMS芯片仍依赖进口，交期在2023年上半年一度延长至40周。公司已启动国产替代验证，预计2024年底完成两款芯片的导入。"""),
dict(lib="acme_reports", id="ar2022_cn_revenue", title="2022年年度报告 · 艾克美中国 · 经营回顾",
     entity="ACME_CN", period="2022", geography="CN", topic="financial_results", language="zh", sensitivity=P,
     text="""2022年，艾克美中国实现营业收入55.5亿元，同比增长6.3%，增速较上年放缓。智能家居业务收入29.5亿元，占比53%，仍是第一大业务；但下半年起房地产新开工面积明显下降，前装订单增速转负。

毛利率为31.5%，较上年下降1.2个百分点，主要原因是芯片涨价。公司通过提前备货锁定了部分芯片价格，但存货周转天数由85天增加到112天。

2022年公司新设新能源汽车传感器事业部，全年取得收入5.3亿元，并进入两家头部整车厂的供应商名录。"""),
dict(lib="acme_reports", id="ar2024h1_cn", title="2024年半年度报告 · 艾克美中国",
     entity="ACME_CN", period="2024", geography="CN", topic="financial_results", language="zh", sensitivity=P,
     text="""2024年上半年，艾克美中国实现营业收入25.9亿元，同比增长4.8%，营收止跌回升。增长主要来自新能源汽车传感器业务，上半年收入5.2亿元，同比增长63%；储能温度监测模组开始批量出货。

智能家居业务收入继续下降9%，但降幅较2023年明显收窄。公司已退出低毛利的前装集采项目，转向后装零售和海外渠道。

毛利率回升至28.1%，主要受益于国产芯片导入和自动化产线的投产。上半年汇兑损失缩小至0.2亿元。"""),
dict(lib="acme_reports", id="pr_cn_price_war", title="新闻稿：艾克美中国回应温湿度模组降价",
     entity="ACME_CN", period="2023", geography="CN", topic="market", language="zh", sensitivity=P,
     text="""针对近期市场关于温湿度模组价格大幅下调的报道，艾克美中国今日表示，公司已对部分标准型号进行价格调整，平均降幅约12%，以应对行业竞争。

公司同时强调，定制化和车规级产品价格保持稳定。降价短期内会对毛利率造成压力，但有助于巩固在头部家电品牌中的份额。公司将通过规模效应和供应链优化消化部分影响。"""),
dict(lib="acme_reports", id="pr_cn_ev_contract", title="新闻稿：艾克美中国获得新能源车企大额订单",
     entity="ACME_CN", period="2023", geography="CN", topic="market", language="zh", sensitivity=P,
     text="""艾克美中国宣布与国内一家头部新能源汽车制造商签订为期三年的电池包温度与压力传感器供货协议，预计合同总金额约12亿元。

这是公司新能源汽车业务成立以来获得的最大单笔订单。首批产品将于2024年第一季度在常州工厂量产。公司表示，该订单将显著对冲智能家居业务的下滑。"""),
dict(lib="acme_reports", id="pr_cn_factory", title="新闻稿：艾克美常州智能工厂投产",
     entity="ACME_CN", period="2024", geography="CN", topic="operations", language="zh", sensitivity=P,
     text="""艾克美中国常州智能工厂今日正式投产。该工厂总投资6.8亿元，配备全自动贴片与标定产线，设计年产能为车规级传感器3000万只。

与原有产线相比，新工厂单位人工成本下降约40%，产品一次良率提升至99.2%。公司预计工厂满产后将使新能源汽车传感器业务的毛利率提高3至4个百分点。"""),
dict(lib="acme_reports", id="bm_cn_2023q3", title="董事会会议纪要 · 艾克美中国 · 2023年第三季度",
     entity="ACME_CN", period="2023", geography="CN", topic="governance", language="zh", sensitivity=R,
     text="""会议讨论了第三季度收入环比下降18%的情况。财务总监汇报：华辰地产已书面通知暂停全部集采订单，且存在约2.3亿元应收账款逾期，计提坏账准备的方案需在年报前确定。

董事会审议通过了深圳工厂裁员方案：智能家居产线将裁减约420人，补偿金预算1.1亿元。方案在正式公告前严格保密，仅限董事会成员知悉。

会议还讨论了收购杭州一家MEMS芯片设计公司的初步意向，代号“青鸟”，估值区间8至10亿元。"""),
dict(lib="acme_reports", id="bm_cn_2024q1", title="董事会会议纪要 · 艾克美中国 · 2024年第一季度",
     entity="ACME_CN", period="2024", geography="CN", topic="governance", language="zh", sensitivity=R,
     text="""董事会听取了“青鸟”项目尽职调查报告。目标公司存在两项核心专利权属争议，董事会决定将报价下调至7亿元，并要求卖方在交割前解决争议。

会议确认华辰地产应收账款已计提坏账准备1.6亿元，剩余部分通过以房抵债方式回收。"""),
dict(lib="acme_reports", id="ar2023_group_summary", title="2023年年度报告 · 艾克美集团 · 董事长致辞",
     entity="ACME_GROUP", period="2023", geography="GLOBAL", topic="financial_results", language="zh", sensitivity=P,
     text="""2023年是艾克美集团充满挑战的一年。集团合并营业收入128.4亿元，同比下降3.1%；归属于母公司的净利润7.2亿元，同比下降29%。

收入下降主要发生在中国区，中国区受房地产低迷和价格竞争影响，收入下降12.4%；美国区收入增长9.7%，数据中心冷却传感器需求旺盛；欧洲区收入下降4.2%，主要受能源成本高企和里昂工厂关停影响。

净利润降幅大于收入降幅，原因是毛利率下降、汇兑损失以及欧洲区关厂相关的一次性费用约2.4亿元。董事会建议每股派发现金红利0.18元，分红比例维持在40%左右。"""),
dict(lib="acme_reports", id="ar2023_group_esg", title="2023年可持续发展报告 · 艾克美集团",
     entity="ACME_GROUP", period="2023", geography="GLOBAL", topic="esg", language="zh", sensitivity=P,
     text="""2023年集团范围一和范围二温室气体排放总量为18.6万吨二氧化碳当量，较2021年基准下降14%。常州和奥斯汀工厂已实现100%绿电采购。

集团员工总数为11,240人，较上年减少6%，主要由于欧洲里昂工厂关停和中国区产线调整。员工安全事故率为每百万工时0.21起。"""),
dict(lib="acme_reports", id="pr_group_dividend", title="公告：艾克美集团2023年度利润分配预案",
     entity="ACME_GROUP", period="2023", geography="GLOBAL", topic="financial_results", language="zh", sensitivity=P,
     text="""公司拟以总股本为基数，向全体股东每10股派发现金红利1.8元（含税），合计派发约2.9亿元，占2023年归母净利润的40.3%。

尽管净利润下降，董事会认为公司现金流状况良好，经营活动现金流净额为15.1亿元，足以支持分红和新能源业务的资本开支。"""),
dict(lib="acme_reports", id="ar2023_cn_rd", title="2023年年度报告 · 艾克美中国 · 研发与技术",
     entity="ACME_CN", period="2023", geography="CN", topic="r_and_d", language="zh", sensitivity=P,
     text="""2023年艾克美中国研发投入4.1亿元，同比增长11%，研发人员占员工总数的23%。全年新增授权发明专利62项。

重点项目包括：车规级多合一压力温度传感器，已通过AEC-Q100认证；储能电池热失控早期预警模组，完成样品交付；国产MEMS芯片替代，两款芯片进入客户验证阶段。"""),
dict(lib="acme_reports", id="ir_cn_qa", title="投资者关系问答 · 艾克美中国业绩说明会",
     entity="ACME_CN", period="2023", geography="CN", topic="investor_relations", language="zh", sensitivity=P,
     text="""问：为什么2023年营收下滑幅度大于同行？答：公司智能家居前装业务占比高于同行，房地产新房交付减少对我们的冲击更直接；此外第一大客户推迟集采，影响了约5亿元收入。

问：毛利率何时能够恢复？答：随着常州工厂投产和国产芯片导入，我们预计2024年下半年毛利率将回到29%左右。

问：是否有裁员计划？答：公司会根据业务结构优化产线配置，具体安排以公司公告为准。"""),
# ----------------------------------------------------------------- acme_reports (en)
dict(lib="acme_reports", id="ar2023_us_results", title="Annual Report 2023 — ACME US — Business Review",
     entity="ACME_US", period="2023", geography="US", topic="financial_results", language="en", sensitivity=P,
     text="""ACME US grew revenue by 9.7% to USD 1.92 billion in 2023. Growth came from data-center cooling sensors, where hyperscale customers expanded liquid-cooling deployments, and from a multi-year contract with a national utility for grid-edge monitoring.

Gross margin fell from 38.2% to 35.9%. The decline was driven by Section 301 tariffs on components sourced from Asia, which added roughly USD 41 million to cost of goods sold, and by expedited freight during the first half.

Operating expenses rose 6% as the company hired 140 engineers for the Austin design center. Management expects margins to recover as the Monterrey plant takes over assembly of tariff-exposed products in 2024."""),
dict(lib="acme_reports", id="ar2023_us_risk", title="Annual Report 2023 — ACME US — Risk Factors",
     entity="ACME_US", period="2023", geography="US", topic="risk", language="en", sensitivity=P,
     text="""Trade policy: about 28% of the bill of materials of ACME US products is imported from Asia and subject to tariffs. A further increase in tariff rates would reduce gross margin by an estimated 1.5 percentage points per 10 points of tariff.

Customer concentration: the three largest hyperscale customers account for 37% of revenue. Their capital expenditure cycles can shift orders between quarters.

Labor market: competition for analog and firmware engineers in Texas raised average compensation by 8% in 2023."""),
dict(lib="acme_reports", id="ar2023_eu_results", title="Annual Report 2023 — ACME EU — Business Review",
     entity="ACME_EU", period="2023", geography="EU", topic="financial_results", language="en", sensitivity=P,
     text="""ACME EU revenue declined 4.2% to EUR 1.05 billion in 2023. Industrial customers in Germany postponed automation projects as energy prices stayed high, and demand for heating-system sensors fell after subsidy programs for heat pumps were cut back.

The Lyon plant was closed in September 2023. Its production of legacy pressure switches was moved to the Brno plant in the Czech Republic. One-off closure costs were EUR 198 million, including severance, asset write-downs and site remediation.

Excluding closure costs, operating margin was 7.8%, compared with 9.1% in 2022. Energy costs per unit produced were 2.3 times the 2021 level."""),
dict(lib="acme_reports", id="pr_eu_lyon", title="Press release: ACME EU to close Lyon plant",
     entity="ACME_EU", period="2023", geography="EU", topic="operations", language="en", sensitivity=P,
     text="""ACME EU today announced its decision to close the Lyon manufacturing site by the end of September 2023. The plant, which employs 610 people, produces legacy pressure switches whose volumes have fallen by half since 2019.

Why close Lyon? Energy costs at the site tripled between 2021 and 2023, and the building would need a EUR 60 million renovation to meet new safety standards. Production will move to Brno, where ACME already runs two modern lines.

ACME EU will offer every affected employee a transfer, retraining or a severance package above the legal minimum."""),
dict(lib="acme_reports", id="pr_us_datacenter", title="Press release: ACME US launches liquid-cooling sensor family",
     entity="ACME_US", period="2023", geography="US", topic="market", language="en", sensitivity=P,
     text="""ACME US introduced the CoolSense family of flow, leak and temperature sensors for direct-to-chip liquid cooling in data centers. Early adopters report that leak detection within two seconds prevents costly server outages.

The launch follows a year in which data-center orders grew 64%, making it the fastest-growing product line of ACME US."""),
dict(lib="acme_reports", id="pr_us_monterrey", title="Press release: ACME US opens Monterrey assembly plant",
     entity="ACME_US", period="2024", geography="US", topic="operations", language="en", sensitivity=P,
     text="""ACME US opened its Monterrey, Mexico assembly plant in March 2024. The USD 85 million site will assemble products that were previously imported from Asia and subject to tariffs.

Management expects the move to lift gross margin by about two percentage points by 2025, and to shorten delivery times to North American customers from six weeks to ten days."""),
dict(lib="acme_reports", id="bm_eu_2023q4", title="Board minutes — ACME EU — Q4 2023",
     entity="ACME_EU", period="2023", geography="EU", topic="governance", language="en", sensitivity=R,
     text="""The board was briefed on the investigation by the French data protection authority into the employee badge-tracking system at Lyon. Counsel estimates a possible fine between EUR 4 and 9 million. No public statement will be made until the authority issues its decision.

The board approved a retention bonus of EUR 2.5 million for the Brno transfer team. The works council has not yet been informed."""),
dict(lib="acme_reports", id="bm_us_2023q2", title="Board minutes — ACME US — Q2 2023",
     entity="ACME_US", period="2023", geography="US", topic="governance", language="en", sensitivity=R,
     text="""The board discussed a whistleblower report alleging that a sales manager offered unapproved rebates to a utility customer. The audit committee engaged outside counsel. Revenue of USD 3.2 million from the contract is on hold pending the review.

The board also reviewed a confidential proposal to acquire a Canadian flow-meter start-up for about USD 120 million."""),
dict(lib="acme_reports", id="ar2023_group_en", title="Annual Report 2023 — ACME Group — Chair's letter (English)",
     entity="ACME_GROUP", period="2023", geography="GLOBAL", topic="financial_results", language="en", sensitivity=P,
     text="""2023 was a difficult year for ACME Group. Consolidated revenue fell 3.1% to RMB 12.84 billion and net profit attributable to shareholders fell 29% to RMB 720 million.

Why did profit fall faster than revenue? Gross margin narrowed in China because of price competition, the group booked foreign-exchange losses as the renminbi weakened, and the closure of the Lyon plant cost about RMB 240 million in one-off charges.

The United States was the bright spot, with revenue up 9.7% on demand for data-center cooling sensors. The board proposes a dividend of RMB 0.18 per share."""),
dict(lib="acme_reports", id="ir_group_call", title="Earnings call transcript — ACME Group FY2023 (excerpt)",
     entity="ACME_GROUP", period="2023", geography="GLOBAL", topic="investor_relations", language="en", sensitivity=P,
     text="""Analyst: What happened in China in the third quarter? CFO: Revenue dropped 18% sequentially because our largest property-developer customer suspended its bulk purchasing, and the price cuts we made to defend share in humidity modules took effect.

Analyst: Is the decline in smart-home structural? CEO: Partly. New-home completions in China will stay low, so we are moving from pre-installed sensors to retail and export channels, and shifting capacity to electric-vehicle and energy-storage sensors, which grew 41% last year.

Analyst: When will the Lyon closure stop affecting results? CFO: The last charges were booked in the fourth quarter of 2023; from 2024 the Brno plant carries the volume at lower energy cost."""),
dict(lib="acme_reports", id="ar2022_us_results", title="Annual Report 2022 — ACME US — Business Review",
     entity="ACME_US", period="2022", geography="US", topic="financial_results", language="en", sensitivity=P,
     text="""ACME US revenue grew 12.1% to USD 1.75 billion in 2022, led by HVAC and industrial automation sensors. Supply of microcontrollers remained tight, and the company paid broker prices for some components, which lowered gross margin to 38.2%.

Data-center products contributed USD 210 million of revenue, up from USD 120 million in 2021."""),
dict(lib="acme_reports", id="ar2024h1_eu", title="Interim Report H1 2024 — ACME EU",
     entity="ACME_EU", period="2024", geography="EU", topic="financial_results", language="en", sensitivity=P,
     text="""ACME EU revenue was flat at EUR 520 million in the first half of 2024. Operating margin recovered to 8.9% because the Lyon closure removed the highest-cost capacity and energy prices eased.

Heat-pump sensor demand remained weak, but orders for factory-automation sensors picked up in May and June."""),
# ----------------------------------------------------------------- acme_policies
dict(lib="acme_policies", id="pol_info_classification", title="Information Classification Policy",
     entity="ACME_GROUP", period="2023", geography="GLOBAL", topic="policy", language="en", sensitivity=P,
     text="""Every document created at ACME Group carries one of four labels: PUBLIC, INTERNAL, CONFIDENTIAL or RESTRICTED. RESTRICTED covers board minutes, unannounced transactions, personnel decisions and regulatory investigations.

RESTRICTED material may not be copied into shared drives, sent to external services, or processed by automated tools that are not approved for that label. Search and question-answering systems must exclude RESTRICTED content from any answer and from any text sent to a language model.

Owners review labels once a year. A document whose label is missing is treated as INTERNAL."""),
dict(lib="acme_policies", id="pol_info_classification_zh", title="信息分级管理制度",
     entity="ACME_GROUP", period="2023", geography="GLOBAL", topic="policy", language="zh", sensitivity=P,
     text="""集团所有文件须标注公开、内部、机密或受限（RESTRICTED）四个级别之一。董事会会议纪要、未公告的交易、人事决定和监管调查材料属于受限级别。

受限材料不得复制到共享盘，不得发送给外部服务，也不得由未经批准的自动化工具处理。检索与问答系统必须在任何回答以及发送给大语言模型的任何文本中排除受限内容。"""),
dict(lib="acme_policies", id="pol_travel", title="Travel and Expense Policy",
     entity="ACME_GROUP", period="2024", geography="GLOBAL", topic="policy", language="en", sensitivity=INT,
     text="""Employees book travel through the approved agency. Economy class is the default for flights under six hours; business class requires vice-president approval.

Expense reports must be filed within 30 days with itemized receipts. Meals with customers are reimbursed up to USD 80 per person in the United States and EUR 70 per person in Europe.

Why was the policy tightened in 2024? Travel spending rose 22% in 2023 while revenue fell, and the group's cost program targets a 10% reduction in discretionary spending."""),
dict(lib="acme_policies", id="pol_travel_zh", title="差旅与费用报销制度",
     entity="ACME_CN", period="2024", geography="CN", topic="policy", language="zh", sensitivity=INT,
     text="""员工出差应通过公司指定的差旅平台预订。六小时以内航班默认经济舱，公务舱须副总裁审批。

费用报销须在30日内提交，并附明细发票。2024年起，为配合降本增效计划，国内出差住宿标准下调10%，非必要出差改为视频会议。"""),
dict(lib="acme_policies", id="pol_anticorruption", title="Anti-Corruption and Rebate Policy",
     entity="ACME_GROUP", period="2023", geography="GLOBAL", topic="policy", language="en", sensitivity=P,
     text="""No employee may offer rebates, discounts or gifts outside the pricing approved by the regional finance team. Any rebate above 2% of contract value requires written approval from the regional CFO.

Employees who suspect a violation should use the whistleblower hotline. Reports are handled by the audit committee and retaliation against a reporter is grounds for dismissal."""),
dict(lib="acme_policies", id="pol_pricing_zh", title="产品定价管理办法",
     entity="ACME_CN", period="2023", geography="CN", topic="policy", language="zh", sensitivity=INT,
     text="""标准型号产品的指导价由产品线负责人每季度制定，降价幅度超过10%须经区域总经理和财务总监共同审批。

2023年第二季度起，为应对温湿度模组价格战，公司临时授权销售团队在5%范围内自主让价，但须在系统中登记原因。该临时授权于2024年3月到期。"""),
dict(lib="acme_policies", id="pol_fx_hedging", title="Foreign Exchange Hedging Policy",
     entity="ACME_GROUP", period="2024", geography="GLOBAL", topic="policy", language="en", sensitivity=INT,
     text="""Subsidiaries hedge at least 50% and at most 80% of forecast foreign-currency purchases for the next twelve months using forwards. Speculative positions are prohibited.

The policy was revised in January 2024 after ACME China recorded RMB 90 million of exchange losses in 2023, when the renminbi weakened against the dollar and most dollar purchases were unhedged."""),
dict(lib="acme_policies", id="pol_fx_hedging_zh", title="外汇套期保值管理制度",
     entity="ACME_CN", period="2024", geography="CN", topic="policy", language="zh", sensitivity=INT,
     text="""各子公司应对未来十二个月预计外币采购额的50%至80%进行远期锁汇，禁止投机性交易。

本制度于2024年1月修订。修订原因是2023年人民币对美元贬值，艾克美中国美元采购大部分未做套保，全年汇兑损失约0.9亿元。"""),
dict(lib="acme_policies", id="pol_data_protection", title="Employee Data Protection Standard",
     entity="ACME_EU", period="2024", geography="EU", topic="policy", language="en", sensitivity=P,
     text="""Personal data of employees may be processed only for a documented purpose, and location data from badges or vehicles may not be used to monitor individual performance.

Every new system that processes employee data requires a data protection impact assessment approved by the EU data protection officer before go-live."""),
dict(lib="acme_policies", id="pol_layoff_procedure", title="Workforce Restructuring Procedure",
     entity="ACME_GROUP", period="2023", geography="GLOBAL", topic="policy", language="en", sensitivity=INT,
     text="""Any restructuring affecting more than 50 employees in one site requires approval from the regional board and consultation with employee representatives where local law requires it.

Affected employees are offered internal transfer first. Severance follows local law and group minimums: at least one month of salary per year of service, and no less than three months in total."""),
dict(lib="acme_policies", id="pol_layoff_zh", title="人员优化工作规程",
     entity="ACME_CN", period="2023", geography="CN", topic="policy", language="zh", sensitivity=INT,
     text="""单一厂区涉及50人以上的人员优化，须经区域董事会批准，并依法履行工会或职工代表大会程序。

受影响员工优先安排内部转岗；经济补偿按照劳动合同法执行，且不低于集团最低标准：每工作一年支付一个月工资，合计不少于三个月。"""),
dict(lib="acme_policies", id="pol_supplier_zh", title="供应商准入与国产替代管理办法",
     entity="ACME_CN", period="2024", geography="CN", topic="policy", language="zh", sensitivity=INT,
     text="""关键芯片和陶瓷基板须至少有两家合格供应商。2023年MEMS芯片交期延长至40周后，公司将国产替代列为年度重点工作。

国产芯片导入须完成可靠性验证、小批量试产和客户认可三个阶段，每个阶段由质量部签字确认。"""),
dict(lib="acme_policies", id="pol_energy_eu", title="Energy Management Standard — European Plants",
     entity="ACME_EU", period="2023", geography="EU", topic="policy", language="en", sensitivity=INT,
     text="""Each European plant reports energy use per unit produced every month. Plants whose energy cost exceeds 12% of production cost must present a reduction plan within one quarter.

In 2023 the Lyon plant reached 19% and Brno 7%, which informed the decision to consolidate legacy production in Brno."""),
dict(lib="acme_policies", id="pol_ai_usage", title="Acceptable Use of AI Assistants",
     entity="ACME_GROUP", period="2024", geography="GLOBAL", topic="policy", language="en", sensitivity=P,
     text="""Employees may use approved AI assistants for drafting and research. Prompts must not contain CONFIDENTIAL or RESTRICTED information unless the tool is approved for that label.

Answers from AI assistants must cite the internal documents they rely on, so that a reader can check the source."""),
dict(lib="acme_policies", id="pol_ai_usage_zh", title="人工智能助手使用规范",
     entity="ACME_CN", period="2024", geography="CN", topic="policy", language="zh", sensitivity=P,
     text="""员工可使用经批准的人工智能助手起草文稿和检索资料。提示词中不得包含机密或受限信息，除非该工具已获准处理相应级别。

人工智能助手给出的回答必须注明所依据的内部文件，便于读者核对原文。"""),
dict(lib="acme_policies", id="hr_restructuring_plan_zh", title="深圳工厂人员优化实施方案（草案）",
     entity="ACME_CN", period="2023", geography="CN", topic="hr", language="zh", sensitivity=R,
     text="""本方案涉及深圳工厂智能家居产线约420名员工，分两批实施，第一批于2023年12月完成。补偿金预算1.1亿元，另设300万元转岗培训基金。

名单及补偿明细附后，仅限人力资源部和董事会成员查阅。"""),
]

GLOSSARY = {
    "groups": [
        {"kind": "metric", "terms": ["营收", "营业收入", "收入", "revenue", "sales"]},
        {"kind": "metric", "terms": ["毛利率", "gross margin"]},
        {"kind": "metric", "terms": ["净利润", "归母净利润", "net profit", "net income"]},
        {"kind": "metric", "terms": ["汇兑损失", "exchange losses", "foreign-exchange losses"]},
        {"kind": "event", "terms": ["下滑", "下降", "decline", "fell"]},
        {"kind": "event", "terms": ["裁员", "人员优化", "layoffs", "restructuring"]},
        {"kind": "event", "terms": ["关税", "tariffs"]},
        {"kind": "entity", "terms": ["艾克美中国", "ACME China", "ACME_CN"]},
        {"kind": "entity", "terms": ["艾克美集团", "ACME Group", "ACME_GROUP"]},
        {"kind": "entity", "terms": ["ACME EU", "ACME Europe", "ACME_EU"]},
        {"kind": "entity", "terms": ["ACME US", "ACME_US"]},
        {"kind": "term", "terms": ["智能家居", "smart home", "smart-home"]},
        {"kind": "term", "terms": ["新能源汽车", "electric-vehicle", "EV"]},
    ]
}

# Golden questions (doc ids judged relevant), used by the quality floor check.
GOLDEN = [
    {"query": "为什么营收下滑", "filters": {"entity": "ACME_CN"},
     "relevant": ["ar2023_cn_revenue", "ir_cn_qa", "ar2023_cn_risk"]},
    {"query": "毛利率为什么下降", "filters": {"entity": "ACME_CN"},
     "relevant": ["ar2023_cn_revenue", "pr_cn_price_war", "ar2022_cn_revenue"]},
    {"query": "why did gross margin fall at ACME US", "filters": None,
     "relevant": ["ar2023_us_results", "ar2023_us_risk", "pr_us_monterrey"]},
    {"query": "why close the Lyon plant", "filters": None,
     "relevant": ["pr_eu_lyon", "ar2023_eu_results", "pol_energy_eu"]},
    {"query": "why did net profit fall faster than revenue", "filters": None,
     "relevant": ["ar2023_group_en", "ar2023_group_summary"]},
    {"query": "汇兑损失", "filters": None,
     "relevant": ["ar2023_cn_risk", "pol_fx_hedging_zh", "pol_fx_hedging"]},
    {"query": "what happened in China in the third quarter", "filters": None,
     "relevant": ["ir_group_call", "ar2023_cn_risk"]},
    {"query": "新能源汽车传感器业务增长", "filters": {"language": "zh"},
     "relevant": ["ar2024h1_cn", "pr_cn_ev_contract", "ar2023_cn_revenue", "pr_cn_factory"]},
]


def write(root: Path = ROOT) -> int:
    ids = set()
    for d in DOCS:
        assert d["id"] not in ids, d["id"]
        ids.add(d["id"])
        lib = root / d["lib"]
        lib.mkdir(parents=True, exist_ok=True)
        (lib / f"{d['id']}.md").write_text(f"# {d['title']}\n\n{d['text'].strip()}\n", encoding="utf-8")
        meta = {k: d[k] for k in ("title", "entity", "period", "geography", "topic", "language", "sensitivity")}
        (lib / f"{d['id']}.meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=2) + "\n",
                                                 encoding="utf-8")
    (root / "glossary.json").write_text(json.dumps(GLOSSARY, ensure_ascii=False, indent=2) + "\n",
                                        encoding="utf-8")
    (root / "golden_queries.json").write_text(json.dumps(GOLDEN, ensure_ascii=False, indent=2) + "\n",
                                              encoding="utf-8")
    return len(DOCS)


if __name__ == "__main__":
    print(f"wrote {write()} documents under {ROOT}")
