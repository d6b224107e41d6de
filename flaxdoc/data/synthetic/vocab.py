"""Word lists for the synthetic documents: names, places, products and key wordings.

Everything here is plain data (tuples of strings), so generated documents vary
in vocabulary without any file or network access. The key wordings are what
make a field recognisable *by its key*: every field has several phrasings, so a
model cannot memorise one string, and several fields share a value format
(dates, amounts, ids) so the key (or the column header above) is what decides
the label.
"""

from __future__ import annotations

FIRST_NAMES = (
    "James", "Mary", "John", "Patricia", "Robert", "Jennifer", "Michael", "Linda", "David",
    "Elizabeth", "William", "Barbara", "Richard", "Susan", "Joseph", "Jessica", "Thomas", "Sarah",
    "Carlos", "Maria", "Ahmed", "Fatima", "Wei", "Mei", "Hiroshi", "Yuki", "Ivan", "Olga", "Luca",
    "Giulia", "Pierre", "Camille", "Hans", "Anna", "Lars", "Ingrid", "Raj", "Priya", "Kwame",
    "Amara", "Diego", "Sofia", "Noah", "Emma", "Liam", "Olivia", "Mateo", "Chloe", "Omar", "Leila",
    "Tomasz", "Zofia", "Siddharth", "Ananya", "Chen", "Lin", "Kofi", "Ada", "Erik", "Freya",
)

LAST_NAMES = (
    "Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller", "Davis", "Rodriguez",
    "Martinez", "Hernandez", "Lopez", "Wilson", "Anderson", "Taylor", "Thomas", "Moore", "Martin",
    "Lee", "Thompson", "White", "Harris", "Clark", "Lewis", "Walker", "Young", "Allen", "King",
    "Wright", "Scott", "Nguyen", "Kim", "Patel", "Singh", "Khan", "Mueller", "Schmidt", "Schneider",
    "Fischer", "Rossi", "Bianchi", "Dubois", "Laurent", "Novak", "Kowalski", "Ivanov", "Tanaka",
    "Sato", "Suzuki", "Wang", "Zhang", "Okafor", "Mensah", "Silva", "Santos", "Jensen", "Larsen",
    "O'Brien", "McCarthy", "Van Dijk",
)

COMPANY_WORDS = (
    "Acme", "Global", "Summit", "Pioneer", "Northwind", "Bluewater", "Redwood", "Silverline",
    "Evergreen", "Horizon", "Keystone", "Atlas", "Apex", "Crescent", "Granite", "Harbor", "Ironclad",
    "Juniper", "Lakeside", "Meridian", "Nimbus", "Oakridge", "Pinnacle", "Quantum", "Riverside",
    "Sterling", "Titan", "Unity", "Vertex", "Westfield", "Zenith", "Orion", "Falcon", "Cobalt",
    "Maple", "Cedar", "Aurora", "Beacon", "Catalyst", "Delta", "Ember", "Fusion", "Golden",
)

COMPANY_TRADES = (
    "Supplies", "Systems", "Trading", "Logistics", "Consulting", "Solutions", "Industries",
    "Electronics", "Foods", "Print", "Office", "Engineering", "Design", "Software", "Medical",
    "Hardware", "Marketing", "Construction", "Textiles", "Labs", "Media", "Partners", "Group",
    "Services", "Imports", "Distribution", "Analytics", "Energy", "Motors", "Furniture",
)

COMPANY_SUFFIXES = (
    "Ltd", "Ltd.", "Inc.", "Inc", "LLC", "GmbH", "S.A.", "B.V.", "Pty Ltd", "Co.", "Corp.", "PLC",
    "& Co.", "AG", "S.r.l.", "Sdn Bhd", "",
)

SHOP_NAMES = (
    "Corner Cafe", "Daily Grind", "Green Grocer", "Quick Mart", "Sunrise Bakery", "Noodle House",
    "Burger Barn", "Fresh Market", "City Pharmacy", "Book Nook", "Tea Garden", "Pizza Palace",
    "Sushi Bar", "Petrol Plus", "Mega Store", "Family Mart", "Coffee Corner", "Deli Delight",
    "Golden Dragon", "Taco Stand", "Hardware Depot", "Pet Planet", "Fuel Stop", "Bistro 21",
)

STREET_NAMES = (
    "Main", "High", "Church", "Park", "Oak", "Maple", "Cedar", "Elm", "Washington", "Lake", "Hill",
    "Station", "Victoria", "King", "Queen", "Market", "Mill", "River", "Bridge", "Green", "North",
    "South", "West", "Harbour", "Orchard", "Meadow", "Kings", "Castle", "Jalan Ampang", "Rue de Lyon",
    "Hauptstrasse", "Via Roma", "Calle Mayor", "Bahnhofstrasse",
)

STREET_TYPES = ("Street", "St", "St.", "Road", "Rd", "Avenue", "Ave", "Lane", "Boulevard", "Blvd",
                "Drive", "Dr", "Way", "Place", "Court", "Square")

UNIT_PREFIXES = ("Suite", "Unit", "Floor", "Building", "Apt", "Room", "Level")

# (city, region or "", postcode pattern, country). Pattern letters: 9 -> digit, A -> letter.
CITIES = (
    ("Springfield", "IL", "99999", "USA"),
    ("Austin", "TX", "99999", "USA"),
    ("Portland", "OR", "99999", "USA"),
    ("Denver", "CO", "99999-9999", "USA"),
    ("Boston", "MA", "99999", "USA"),
    ("London", "", "AA9A 9AA", "United Kingdom"),
    ("Manchester", "", "A9 9AA", "United Kingdom"),
    ("Leeds", "", "AA9 9AA", "United Kingdom"),
    ("Berlin", "", "99999", "Germany"),
    ("Munich", "", "99999", "Germany"),
    ("Paris", "", "99999", "France"),
    ("Lyon", "", "99999", "France"),
    ("Milan", "MI", "99999", "Italy"),
    ("Madrid", "", "99999", "Spain"),
    ("Amsterdam", "", "9999 AA", "Netherlands"),
    ("Toronto", "ON", "A9A 9A9", "Canada"),
    ("Sydney", "NSW", "9999", "Australia"),
    ("Melbourne", "VIC", "9999", "Australia"),
    ("Singapore", "", "999999", "Singapore"),
    ("Kuala Lumpur", "", "99999", "Malaysia"),
    ("Jakarta", "", "99999", "Indonesia"),
    ("Mumbai", "MH", "999999", "India"),
    ("Tokyo", "", "999-9999", "Japan"),
    ("Dublin", "", "A99 A9A9", "Ireland"),
    ("Zurich", "", "9999", "Switzerland"),
)

EMAIL_USERS = ("info", "sales", "billing", "accounts", "contact", "hello", "office", "support",
               "orders", "admin")
EMAIL_TLDS = ("com", "co.uk", "de", "net", "org", "io", "fr", "com.au", "biz", "co")

# Invoice line items: (description words, low price, high price).
PRODUCTS = (
    ("Wireless Mouse", 8, 60), ("USB-C Cable 2m", 5, 25), ("A4 Copy Paper (box)", 20, 45),
    ("Laser Toner Cartridge", 40, 180), ("Office Chair", 90, 600), ("Standing Desk", 250, 900),
    ("Monitor 27 inch", 150, 650), ("Mechanical Keyboard", 40, 220), ("Laptop Stand", 20, 90),
    ("Consulting services", 80, 250), ("Software licence (annual)", 100, 2400),
    ("Website maintenance", 50, 900), ("Graphic design hours", 40, 150), ("Cloud hosting plan", 10, 400),
    ("Installation fee", 50, 300), ("Training session", 150, 1500), ("Shipping and handling", 5, 80),
    ("Printer Ink Black", 15, 60), ("Stapler heavy duty", 8, 40), ("Whiteboard markers (12)", 6, 25),
    ("Network switch 24-port", 120, 800), ("External SSD 1TB", 60, 200), ("HDMI adapter", 8, 30),
    ("Project management", 60, 200), ("Translation per page", 15, 60), ("Catering per person", 12, 60),
    ("Safety gloves (pair)", 2, 15), ("Steel bolts M8 (100)", 6, 40), ("Paint 5L white", 20, 90),
    ("Copper pipe 15mm", 4, 30), ("LED panel 60x60", 25, 120), ("Annual support contract", 500, 5000),
    ("Data analysis report", 300, 3000), ("Photography session", 150, 1200), ("Legal review", 150, 600),
    ("Notebook A5 ruled", 2, 12), ("Desk lamp", 15, 80), ("Filing cabinet", 80, 400),
)

PRODUCT_ADJECTIVES = ("Premium", "Standard", "Deluxe", "Basic", "Pro", "Compact", "Large", "Small",
                      "Blue", "Black", "Recycled", "Express", "Extended", "")

# Receipt items: (name, low price, high price), small amounts.
MENU_ITEMS = (
    ("Latte", 3, 6), ("Cappuccino", 3, 6), ("Espresso", 2, 4), ("Croissant", 2, 5),
    ("Blueberry Muffin", 2, 5), ("Chicken Burger", 7, 15), ("Fries", 2, 5), ("Caesar Salad", 6, 13),
    ("Fried Rice", 5, 12), ("Beef Noodle Soup", 6, 14), ("Iced Tea", 2, 5), ("Mineral Water", 1, 3),
    ("Orange Juice", 2, 6), ("Milk 1L", 1, 3), ("Bread Loaf", 2, 5), ("Eggs (12)", 3, 6),
    ("Bananas 1kg", 1, 4), ("Chicken Breast", 5, 12), ("Cheddar Cheese", 3, 8), ("Pasta 500g", 1, 3),
    ("Tomato Sauce", 2, 5), ("Shampoo 400ml", 3, 9), ("Toothpaste", 2, 5), ("Paracetamol 500mg", 2, 7),
    ("Unleaded 95", 20, 90), ("Car Wash", 8, 20), ("Notebook", 2, 6), ("Ballpoint Pens (5)", 2, 6),
    ("Margherita Pizza", 8, 16), ("Green Tea", 2, 4), ("Sushi Set", 9, 25), ("Chocolate Bar", 1, 3),
    ("Sandwich", 4, 9), ("Cola 330ml", 1, 3), ("Dumplings (6)", 4, 9), ("Pad Thai", 7, 14),
)

# --- key wordings, per field -------------------------------------------------

DOC_ID_KEYS = {
    "invoice": ("Invoice No.", "Invoice #", "Inv. Number", "Invoice Number", "Invoice No",
                "Bill No.", "Document No.", "Invoice ID", "Ref. No."),
    "receipt": ("Receipt No.", "Rcpt #", "Receipt #", "Trans #", "Bill No", "Order #", "Check #",
                "Invoice No", "No."),
    "form": ("Reference No.", "Ref.", "Application No.", "Form ID", "Request #", "Case Number",
             "Reference"),
}
DATE_KEYS = {
    "invoice": ("Date", "Invoice Date", "Issue Date", "Date of Issue", "Dated", "Billing Date",
                "Inv. Date"),
    "receipt": ("Date", "Date:", "Dt", "Trans Date"),
    "form": ("Date", "Date Submitted", "Application Date", "Date Received", "Submitted On"),
}
DUE_DATE_KEYS = {
    "invoice": ("Due Date", "Payment Due", "Due", "Pay By", "Due On", "Payment Due Date",
                "Due By"),
    "receipt": ("Return By", "Valid Until"),
    "form": ("Valid Until", "Expiry Date", "Expires", "Renewal Date", "Valid To"),
}
SELLER_HEADERS = ("From", "Seller", "Supplier", "Vendor", "Sold By", "Issued By", "Bill From")
BUYER_HEADERS = ("Bill To", "Billed To", "Customer", "Client", "Invoice To", "Buyer", "Sold To",
                 "To")
SHIP_HEADERS = ("Ship To", "Deliver To", "Delivery Address", "Shipping Address")
PHONE_KEYS = ("Tel", "Phone", "Tel.", "Ph", "Telephone", "Mobile", "Contact No.", "T")
EMAIL_KEYS = ("Email", "E-mail", "Mail", "E", "Email Address")
BUYER_NAME_KEYS = ("Full Name", "Name", "Applicant Name", "Customer Name", "Contact Person",
                   "Name of Applicant", "Client Name")
ADDRESS_KEYS = ("Address", "Street Address", "Mailing Address", "Home Address", "Postal Address")

# Key / value pairs whose value is labelled O: they look like labelled fields
# (ids, dates, amounts) but are not, so the key is what decides.
DISTRACTOR_ID_KEYS = ("PO Number", "P.O. #", "Customer ID", "Account No.", "Order No.",
                      "VAT Reg. No.", "Tax ID", "Client Ref.", "Project Code", "Member ID")
DISTRACTOR_DATE_KEYS = ("Ship Date", "Order Date", "Date of Birth", "Delivery Date",
                        "Period Start", "Service Date")
TERMS_VALUES = ("Net 30", "Net 15", "Due on receipt", "Net 60", "2/10 Net 30", "COD", "Prepaid")

# --- table headers, per column ----------------------------------------------

COLUMN_HEADERS = {
    "no": ("No.", "#", "Item", "Line", "S/N", "Pos."),
    "code": ("Code", "SKU", "Item Code", "Part No.", "Ref", "Article"),
    "desc": ("Description", "Item", "Product", "Details", "Item Description", "Service",
             "Particulars", "Article Description"),
    "qty": ("Qty", "Quantity", "QTY", "Qty.", "Units", "Hours", "Hrs", "Pcs", "Count"),
    "unit": ("Unit", "UoM", "Unit Type"),
    "unit_price": ("Unit Price", "Price", "Rate", "Unit Cost", "Price/Unit", "Each", "Unit Rate",
                   "Cost"),
    "tax_rate": ("Tax", "VAT %", "Tax Rate", "GST", "Tax %"),
    "discount": ("Disc.", "Discount", "Disc %"),
    "amount": ("Amount", "Total", "Line Total", "Net Amount", "Ext. Price", "Sum", "Value",
               "Subtotal"),
}
UNITS = ("pcs", "ea", "kg", "h", "hrs", "box", "set", "m", "L", "pack")

# --- totals ------------------------------------------------------------------

SUBTOTAL_KEYS = ("Subtotal", "Sub Total", "Sub-total", "Net Total", "Total excl. VAT",
                 "Amount before tax", "Net", "SUBTOTAL")
TAX_KEYS = ("Tax", "VAT", "GST", "Sales Tax", "Tax Amount", "VAT Amount")
TOTAL_KEYS = ("Total", "Grand Total", "Amount Due", "Total Due", "Balance Due", "Total Amount",
              "TOTAL", "Invoice Total", "Total incl. VAT", "Amount Payable")
DISTRACTOR_TOTAL_KEYS = ("Shipping", "Discount", "Deposit", "Paid", "Rounding", "Service Charge",
                         "Handling")
RECEIPT_PAYMENT_KEYS = ("CASH", "Cash", "CARD", "VISA", "MASTERCARD", "Tendered", "Debit",
                        "E-Wallet")
RECEIPT_CHANGE_KEYS = ("CHANGE", "Change", "Change Due", "Balance")

# --- titles, notes and footers (all labelled O) -------------------------------

INVOICE_TITLES = ("INVOICE", "Invoice", "TAX INVOICE", "Tax Invoice", "Commercial Invoice",
                  "BILL", "Sales Invoice", "Proforma Invoice")
FORM_TITLES = ("Customer Registration Form", "Account Application", "Service Request Form",
               "Order Form", "Membership Application", "Supplier Registration",
               "Change of Address Form", "Purchase Requisition", "Warranty Claim Form",
               "Credit Application")
FORM_SECTIONS = ("Applicant Details", "Personal Information", "Contact Details",
                 "Customer Information", "Account Details", "Request Details", "Order Details",
                 "Items Requested", "Declaration", "Office Use Only")
FORM_OTHER_FIELDS = (
    ("Occupation", ("Engineer", "Teacher", "Nurse", "Accountant", "Student", "Manager",
                    "Designer", "Self-employed", "Retired")),
    ("Nationality", ("British", "German", "French", "Canadian", "Australian", "Indian",
                     "Japanese", "Brazilian", "Kenyan")),
    ("Gender", ("Female", "Male", "Other", "Prefer not to say")),
    ("Marital Status", ("Single", "Married", "Divorced", "Widowed")),
    ("Preferred Contact", ("Email", "Phone", "Post", "SMS")),
    ("Department", ("Finance", "Sales", "IT", "Operations", "HR", "Legal", "Facilities")),
    ("Company", ()),
)
NOTES = (
    "Thank you for your business.",
    "Payment is due within 30 days of the invoice date.",
    "Please include the invoice number with your payment.",
    "Goods remain the property of the seller until paid in full.",
    "Late payments are subject to a 1.5% monthly fee.",
    "All prices are in the stated currency.",
    "Questions about this invoice? Contact our billing team.",
    "Returns accepted within 14 days with receipt.",
    "This is a computer generated document and needs no signature.",
    "We appreciate your prompt payment.",
    "Bank transfer details are given below.",
)
RECEIPT_FOOTERS = ("THANK YOU", "Thank you!", "Please come again", "Have a nice day",
                   "THANK YOU FOR SHOPPING", "No refunds without receipt", "See you soon!",
                   "Keep this receipt", "Follow us @shop", "Customer copy")
DECLARATIONS = (
    "I declare that the information given above is true and complete.",
    "By signing this form I agree to the terms and conditions.",
    "Please complete all fields in block capitals.",
    "Incomplete applications may be delayed.",
    "Return the completed form to the address above.",
)
BANKS = ("First National Bank", "City Bank", "Commerzbank", "Barclays", "HSBC", "Maybank",
         "BNP Paribas", "ING", "Westpac", "DBS Bank")
RECEIPT_META_KEYS = ("Cashier", "Server", "Table", "Terminal", "Register", "Staff", "POS")

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
MONTHS_SHORT = tuple(m[:3] for m in MONTHS)
